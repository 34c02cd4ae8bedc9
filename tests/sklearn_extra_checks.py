"""The scikit-learn estimator checks that check_estimator does not run itself (its own test suite calls them),
run on every skflow estimator."""

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
