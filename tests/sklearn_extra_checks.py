"""The scikit-learn estimator checks that check_estimator does not run itself (its own test suite calls them),
run on every skflow estimator, and the assertion that check_estimator itself passes in full."""

from sklearn.utils import estimator_checks as ec

EXTRA_CHECKS = [
    ec.check_dataframe_column_names_consistency,
    ec.check_transformer_get_feature_names_out,
    ec.check_transformer_get_feature_names_out_pandas,
    ec.check_get_feature_names_out_error,
    ec.check_set_output_transform,
    ec.check_set_output_transform_pandas,
    ec.check_global_output_transform_pandas,
    ec.check_set_output_transform_polars,
    ec.check_global_set_output_transform_polars,
    ec.check_param_validation,
    ec.check_inplace_ensure_writeable,
]


def assert_check_estimator_passes(estimator) -> None:
    """Every check of ``check_estimator`` passes (none skipped: the array API one runs too)."""
    results = ec.check_estimator(estimator, on_fail=None, on_skip=None)
    not_passed = [(r["check_name"], r["status"], repr(r["exception"])) for r in results if r["status"] != "passed"]
    assert not_passed == []
    assert len(results) >= 47
    assert any(r["check_name"] == "check_array_api_input" for r in results)
