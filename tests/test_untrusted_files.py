"""Files from somebody else, written as an attacker would: they never run code nor exhaust memory.

Sentence-transformers folders carry sentinel code (it writes a file when imported or unpickled); every
test shows the sentinel did not run. Crafted ``.skops`` files are loaded in a subprocess under a 2 GiB
address-space limit and a 60 s timeout, so a regression fails instead of taking the machine down.
"""

import io
import itertools
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.pipeline import FeatureUnion, Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

import skflow
from skflow import BertEmbedder, FlowGaussianizer, export_sentence_transformer
from skflow.flow_estimator._size import flow_size
from skflow.flows import Glow
from skflow.persistence import InvalidModelError, UntrustedTypeError
from skflow.serving import FlowPooling, load_sentence_transformer
from skflow.synthetic import make_anisotropic_mixture

REPO = Path(__file__).resolve().parents[1]
CONFIG_AUTO_MAP = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel"}
TRANSFORMER_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     "sentence_bert_config.json")


# ---------------------------------------------------------------- sentence-transformers folders
@pytest.fixture(scope="module")
def exported(tmp_path_factory, sts_data_home):
    """A genuine export (mean pooling over layers 2 and 4, so that hidden states matter), its texts and vectors."""
    from skflow.datasets import load_sts

    texts = list(load_sts("stsb", split="dev", data_home=sts_data_home).pairs[:40].ravel())
    pipe = make_pipeline(BertEmbedder(pooling="mean", layers=[2, 4], dtype="float32", max_length=32),
                         FlowGaussianizer(random_state=0, max_epochs=2)).fit(texts)
    folder = export_sentence_transformer(pipe, tmp_path_factory.mktemp("genuine") / "model")
    return folder, texts, pipe.transform(texts)


def _clone(folder: Path, tmp_path: Path) -> Path:
    """A copy of ``folder`` (its large files hard-linked: edit files only through _write)."""
    copy = tmp_path / "model"
    shutil.copytree(folder, copy, copy_function=_link_if_large)
    return copy


def _link_if_large(source, target):
    (os.link if os.path.getsize(source) > 2**20 else shutil.copy2)(source, target)


def _write(path: Path, content) -> None:
    path.unlink(missing_ok=True)  # never write through a hard link into the genuine folder
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))


def _edit_json(path: Path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    _write(path, value)


def _plant(folder: Path, name: str, sentinel: Path) -> None:
    """Python that transformers imports for an auto_map entry; importing it writes ``sentinel``."""
    _write(folder / name, textwrap.dedent(f"""\
        import pathlib
        pathlib.Path({str(sentinel)!r}).write_text("the folder's code ran")
        from transformers import BertConfig as EvilConfig, BertModel as EvilModel
        from transformers import BertTokenizerFast as EvilTokenizer, BertTokenizerFast as EvilProcessor
        """))


def _auto_map_in_config(folder, sentinel, outside):
    _edit_json(folder / "config.json", lambda c: c.update(auto_map=CONFIG_AUTO_MAP))
    _plant(folder, "configuration_evil.py", sentinel)
    _plant(folder, "modeling_evil.py", sentinel)


def _auto_map_in_tokenizer_config(folder, sentinel, outside):
    auto_map = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", "tokenization_evil.EvilTokenizer"]}
    _edit_json(folder / "tokenizer_config.json", lambda c: c.update(auto_map=auto_map))
    _plant(folder, "tokenization_evil.py", sentinel)


def _auto_map_in_processor_config(folder, sentinel, outside):
    _write(folder / "processor_config.json",
           {"auto_map": {"AutoProcessor": "processing_evil.EvilProcessor"}, "processor_class": "EvilProcessor"})
    _plant(folder, "processing_evil.py", sentinel)


def _move_transformer(folder: Path, subfolder: str) -> Path:
    target = folder / subfolder
    target.mkdir()
    for name in TRANSFORMER_FILES:
        os.rename(folder / name, target / name)
    return target


def _auto_map_in_a_module_subfolder(folder, sentinel, outside):
    sub = _move_transformer(folder, "0_Transformer")
    _auto_map_in_config(sub, sentinel, outside)
    for name in ("configuration_evil.py", "modeling_evil.py"):  # where plain sentence-transformers looks too
        _plant(folder, name, sentinel)
    _edit_json(folder / "modules.json", lambda m: m[0].update(path="0_Transformer"))


def _auto_map_behind_a_symlinked_subfolder(folder, sentinel, outside):
    _auto_map_in_config(_move_transformer(folder, "evil"), sentinel, outside)
    (folder / "0_Transformer").symlink_to("evil", target_is_directory=True)
    _edit_json(folder / "modules.json", lambda m: m[0].update(path="0_Transformer"))


def _pickled_weights(folder, sentinel, outside):
    class Payload:
        def __reduce__(self):
            return exec, (f"import pathlib; pathlib.Path({str(sentinel)!r}).write_text('unpickled')",)

    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"embeddings.word_embeddings.weight": Payload()}))


def _pooling_linked_outside(folder, sentinel, outside):
    shutil.move(folder / "1_FlowPooling", outside / "pooling")
    _edit_json(outside / "pooling" / "config.json", lambda c: c.update(auto_map=CONFIG_AUTO_MAP))
    _plant(outside / "pooling", "modeling_evil.py", sentinel)
    (folder / "1_FlowPooling").symlink_to(outside / "pooling", target_is_directory=True)


def _path_with_dot_dot(folder, sentinel, outside):
    shutil.move(folder / "1_FlowPooling", outside / "pooling")
    _edit_json(folder / "modules.json", lambda m: m[1].update(path="../outside/pooling"))


def _absolute_path(folder, sentinel, outside):
    shutil.move(folder / "1_FlowPooling", outside / "pooling")
    _edit_json(folder / "modules.json", lambda m: m[1].update(path=str(outside / "pooling")))


def _extra_module(folder, sentinel, outside):
    _edit_json(folder / "modules.json",
               lambda m: m.append({"idx": 2, "name": "2", "path": "", "type": "transformers_modules.evil.Payload"}))


def _other_transformer_type(folder, sentinel, outside):
    _edit_json(folder / "modules.json", lambda m: m[0].update(type="transformers_modules.evil.Payload"))


def _adapter_config(folder, sentinel, outside):
    _write(folder / "adapter_config.json", {"base_model_name_or_path": str(outside), "peft_type": "LORA"})


def _fifo_config(folder, sentinel, outside):
    (folder / "tokenizer_config.json").unlink()
    os.mkfifo(folder / "tokenizer_config.json")  # reading it would block for ever


INSIDE = "must lead to a folder inside the model folder"
LOADS = None  # the loader builds the model, ignoring what the folder names
ATTACKS = {
    "auto_map in config.json": (_auto_map_in_config, LOADS),
    "auto_map in tokenizer_config.json": (_auto_map_in_tokenizer_config, LOADS),
    "auto_map in processor_config.json": (_auto_map_in_processor_config, (InvalidModelError, "custom code")),
    "auto_map in a module subfolder's config.json": (_auto_map_in_a_module_subfolder, LOADS),
    "auto_map behind a symlinked subfolder": (_auto_map_behind_a_symlinked_subfolder, LOADS),
    "pickled weights instead of safetensors": (_pickled_weights, (InvalidModelError, "model.safetensors")),
    "a module linked to a folder outside": (_pooling_linked_outside, (InvalidModelError, INSIDE)),
    "a module path with ..": (_path_with_dot_dot, (InvalidModelError, INSIDE)),
    "an absolute module path": (_absolute_path, (InvalidModelError, INSIDE)),
    "an extra module": (_extra_module, (InvalidModelError, "must list exactly two modules")),
    "another module type": (_other_transformer_type, (UntrustedTypeError, "transformers_modules.evil.Payload")),
    "a PEFT adapter pointing elsewhere": (_adapter_config, (InvalidModelError, "adapter_config.json")),
    "a FIFO for a config file": (_fifo_config, (InvalidModelError, "not a model file or folder")),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_crafted_folder_never_runs_its_code(tmp_path, exported, attack):
    genuine, texts, expected = exported
    craft, outcome = ATTACKS[attack]
    sentinel, outside = tmp_path / "sentinel", tmp_path / "outside"
    outside.mkdir()
    folder = _clone(genuine, tmp_path)
    craft(folder, sentinel, outside)
    if outcome is LOADS:
        model = load_sentence_transformer(folder, device="cpu")
        np.testing.assert_allclose(_cosines(model.encode(texts), expected), 1.0, atol=1e-4)
    else:
        with pytest.raises(outcome[0], match=outcome[1]):
            load_sentence_transformer(folder, device="cpu")
    assert not sentinel.exists(), "the folder's code ran"


def test_plain_sentence_transformers_with_trust_remote_code_runs_the_folders_code(tmp_path, exported):
    """The risk the docs describe, shown: the same folders run their code through the flag."""
    results = {}
    for name in ("auto_map in config.json", "auto_map in tokenizer_config.json", "auto_map in processor_config.json"):
        case = tmp_path / str(len(results))
        case.mkdir()
        (case / "outside").mkdir()
        folder = _clone(exported[0], case)
        ATTACKS[name][0](folder, case / "sentinel", case / "outside")
        results[name] = case
    script = textwrap.dedent(f"""\
        from sentence_transformers import SentenceTransformer
        for case in {[str(c) for c in results.values()]!r}:
            SentenceTransformer(case + "/model", device="cpu", trust_remote_code=True)
        """)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300, capture_output=True)
    assert {name: (case / "sentinel").exists() for name, case in results.items()} == dict.fromkeys(results, True)


def _cosines(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


MODULES_JSON = [
    (None, "missing; not a folder written by skflow.export_sentence_transformer"),
    ("[{", "not readable JSON"),
    ({"idx": 0}, "must list exactly two modules"),
    ([{"idx": 0, "name": "0", "path": ""}, {}], "module 0 must be {'idx': 0, 'name': str, .*, got {'idx': 0, "),
    ([{"idx": "0", "name": "0", "path": "", "type": "x"}, {}], "module 0 must be .*, got {'idx': '0'"),
    ([{"idx": 0, "name": "0", "path": 0, "type": "x"}, {}], "module 0 must be .*'path': 0"),
    ([{"idx": 1, "name": "0", "path": "", "type": "x"}, {}], "module 0 must be {'idx': 0, .*, got {'idx': 1"),
]


@pytest.mark.parametrize("content, message", MODULES_JSON, ids=str)
def test_a_missing_or_malformed_modules_json_is_refused(tmp_path, exported, content, message):
    folder = _clone(exported[0], tmp_path)
    if content is None:
        (folder / "modules.json").unlink()
    else:
        _write(folder / "modules.json", content)
    with pytest.raises(InvalidModelError, match=rf"modules.json: {message}"):
        load_sentence_transformer(folder)


def test_a_null_byte_in_a_module_path_and_links_into_proc_are_refused(tmp_path, exported):
    folder = _clone(exported[0], tmp_path)
    _edit_json(folder / "modules.json", lambda modules: modules[1].update(path="1_FlowPooling\u0000x"))
    with pytest.raises(InvalidModelError, match=INSIDE):
        load_sentence_transformer(folder)
    for target in ("/proc/self/status", "/dev/zero"):  # a reader of /proc/kmsg would block; /dev/zero never ends
        folder = _clone(exported[0], tmp_path / target.replace("/", "_"))
        (folder / "tokenizer_config.json").unlink()
        os.symlink(target, folder / "tokenizer_config.json")
        with pytest.raises(InvalidModelError, match="tokenizer_config.json: not a model file or folder"):
            load_sentence_transformer(folder)


POOLING_CONFIGS = [
    ({"reduction": "weightedmean"}, "unknown reduction 'weightedmean'"),
    ({"layers": [-1]}, r"layers must be null or a non-empty list"),
    ({"layers": []}, r"layers must be null or a non-empty list"),
    ({"layers": "2"}, r"layers must be null or a non-empty list"),
    ({"layers": [2, 99]}, r"layers \[2, 99\] do not exist; the encoder has hidden_states 0 to 6"),
    ({"normalize": "false"}, "normalize must be true or false"),
    ({"pooling": "mean"}, "FlowPooling's configuration is refused: .*unexpected keyword argument 'pooling'"),
]


@pytest.mark.parametrize("change, message", POOLING_CONFIGS, ids=str)
def test_a_bad_pooling_configuration_is_refused_never_mean_pooled(tmp_path, exported, change, message):
    folder = _clone(exported[0], tmp_path)
    _edit_json(folder / "1_FlowPooling" / "config.json", lambda c: c.update(change))
    with pytest.raises(InvalidModelError, match=rf"1_FlowPooling/config.json: (FlowPooling's .* refused: )?{message}"):
        load_sentence_transformer(folder)
    if "do not exist" not in message:  # FlowPooling.load, which plain sentence-transformers calls, refuses it too
        with pytest.raises(InvalidModelError, match=message):
            FlowPooling.load(str(folder / "1_FlowPooling"))


def test_a_missing_or_foreign_flow_and_other_arguments_are_refused(tmp_path, exported):
    folder = _clone(exported[0], tmp_path)
    with pytest.raises(TypeError, match="never runs code from the folder; it takes no trust_remote_code"):
        load_sentence_transformer(folder, trust_remote_code=True)
    with pytest.raises(ValueError, match="unknown reduction 'weightedmean'"):
        FlowPooling("weightedmean", None, False)
    skflow.dump(StandardScaler().fit(np.eye(3)), tmp_path / "scaler.skops")
    (folder / "1_FlowPooling" / "flow.skops").unlink()
    shutil.copy(tmp_path / "scaler.skops", folder / "1_FlowPooling" / "flow.skops")
    with pytest.raises(InvalidModelError, match="flow.skops: holds a StandardScaler, not a fitted FlowGaussianizer"):
        load_sentence_transformer(folder)
    skflow.dump(FlowGaussianizer(), folder / "1_FlowPooling" / "unfitted.skops")
    os.replace(folder / "1_FlowPooling" / "unfitted.skops", folder / "1_FlowPooling" / "flow.skops")
    with pytest.raises(InvalidModelError, match="flow.skops: holds an unfitted FlowGaussianizer"):
        load_sentence_transformer(folder)
    (folder / "1_FlowPooling" / "flow.skops").unlink()
    with pytest.raises(InvalidModelError, match="flow.skops: cannot be read .*FileNotFoundError"):
        load_sentence_transformer(folder)
    with pytest.raises(InvalidModelError, match="flow.skops: cannot be read .*FileNotFoundError"):
        FlowPooling.load(str(folder / "1_FlowPooling"))


# ---------------------------------------------------------------- .skops files: sizes before reading
LOADER = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))  # a regression fails here, not the machine
import skflow
results = []
for path in sys.argv[1:]:
    start = time.perf_counter()
    try:
        skflow.load(path)
        outcome = ["loaded", ""]
    except Exception as exc:
        outcome = [type(exc).__name__, str(exc)]
    results.append(outcome + [time.perf_counter() - start])
print(json.dumps(results))
"""


def _load_in_a_subprocess(*paths):
    """``[exception name or "loaded", message, seconds]`` per file, loaded under 2 GiB of address space, in 60 s."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", LOADER, *map(str, paths)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _members(path: Path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _write_archive(path: Path, members: dict, zeros: dict | None = None) -> Path:
    """Write ``members``; each of ``zeros`` (name -> .npy header, byte count) is that many zero bytes, deflated."""
    path.unlink(missing_ok=True)
    chunk = bytes(2**24)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, data in members.items():
            if name not in (zeros or {}):
                archive.writestr(name, data, compress_type=zipfile.ZIP_STORED)
        for name, (header, n_bytes) in (zeros or {}).items():
            with archive.open(name, "w", force_zip64=True) as stream:
                stream.write(header)
                for start in range(0, n_bytes, len(chunk)):
                    stream.write(chunk[: min(len(chunk), n_bytes - start)])
    return path


def _npy_header(shape, descr="<f8") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _flow_attributes(schema: dict) -> dict:
    """The saved FlowGaussianizer's attributes: the file's root, or the last step of a pipeline."""
    node = schema
    if node["__class__"] != "FlowGaussianizer":
        node = node["content"]["content"]["steps"]["content"][-1]["content"][1]
    return node["content"]["content"]


_unique_ids = itertools.count(10**15)


def _set_json(node: dict, value) -> None:
    node["content"] = json.dumps(value)
    node["__id__"] = next(_unique_ids)  # skops shares equal small ints by id: give the edited one its own


def _genuine(tmp_path: Path, model=None) -> tuple:
    if model is None:
        model = FlowGaussianizer(random_state=0, max_epochs=1).fit(make_anisotropic_mixture(300, 8, random_state=0))
    path = skflow.dump(model, tmp_path / f"{next(_unique_ids)}.skops")
    return path, _members(path), json.loads(_members(path)["schema.json"])


def _depth_raised(tmp_path, depth):
    path, members, schema = _genuine(tmp_path)
    _set_json(_flow_attributes(schema)["_flow_config"]["content"]["depth"], depth)
    return _write_archive(path, {**members, "schema.json": json.dumps(schema).encode()})


def _zeros_in_a_flow_weight(tmp_path, n_values=200_000_000):
    path, members, schema = _genuine(tmp_path)
    first = next(iter(_flow_attributes(schema)["flow_"]["content"].values()))["file"]
    header = _npy_header((n_values,))
    return _write_archive(path, members, zeros={first: (header, 8 * n_values)})


def _zeros_in_a_scikit_learn_array(tmp_path, n_values=200_000_000):
    X = make_anisotropic_mixture(300, 8, random_state=0)
    path, members, schema = _genuine(tmp_path, make_pipeline(StandardScaler(), FlowGaussianizer(max_epochs=1)).fit(X))
    scaler = schema["content"]["content"]["steps"]["content"][0]["content"][1]["content"]["content"]
    return _write_archive(path, members, zeros={scaler["scale_"]["file"]: (_npy_header((n_values,)), 8 * n_values)})


def _schema_of_spaces(tmp_path):
    path, members, _ = _genuine(tmp_path)
    header = b'{"__class__": "dict", "__module__": "builtins", "__loader__": "DictNode", "content": {}'
    del members["schema.json"]
    return _write_archive(path, members, zeros={"schema.json": (header, 200_000_000)})


@pytest.mark.slow
def test_crafted_skops_files_are_refused_before_anything_is_read_or_built(tmp_path):
    raised = [_depth_raised(tmp_path, depth) for depth in (10**6, 10**15, 300)]  # past the steps, past the weights
    genuine = _genuine(tmp_path)[0]
    crafted = [_zeros_in_a_flow_weight(tmp_path), _zeros_in_a_scikit_learn_array(tmp_path), _schema_of_spaces(tmp_path)]
    assert all(path.stat().st_size < 10 * 2**20 for path in crafted)  # 1.6 GB of zeros each, declared
    os.mkfifo(tmp_path / "fifo.skops")  # opening it for reading would wait for a writer
    results = _load_in_a_subprocess(genuine, *raised, *crafted, tmp_path / "fifo.skops")
    assert results.pop()[:2] == ["InvalidModelError", f"{tmp_path / 'fifo.skops'}: not a regular file"]
    assert results[0][:2] == ["loaded", ""]  # the limits leave room for a genuine model
    config = dict(n_features=8, n_levels=3, coupling="additive", permutation="reverse", hidden_channels=32)
    refused = "the flow's configuration is refused: the flow would have"
    assert [result[:2] for result in results[1:4]] == [
        ["InvalidModelError", f"{raised[0]}: {refused} 3000000 steps (depth x levels), more than 1000"],
        ["InvalidModelError", f"{raised[1]}: {refused} {3 * 10**15} steps (depth x levels), more than 1000"],
        ["InvalidModelError", f"{raised[2]}: {refused} {flow_size({**config, 'depth': 300})[1]} weights, more than "
                              f"the {flow_size({**config, 'depth': 3})[1]} saved"],
    ]
    for (name, message, _), path in zip(results[4:], crafted):
        assert name == "InvalidModelError" and message.startswith(f"{path}: ")
        assert "more than" in message and ("the archive declares" in message or "schema.json declares" in message)


def test_array_headers_must_account_for_their_member_exactly(tmp_path):
    path, members, schema = _genuine(tmp_path)
    first = next(iter(_flow_attributes(schema)["flow_"]["content"].values()))["file"]
    _write_archive(path, {**members, first: _npy_header((10**9,)) + bytes(64)})
    with pytest.raises(InvalidModelError, match=rf"array {first}: its header declares 8000000\d+ bytes, the member"):
        skflow.load(path)
    _write_archive(path, {**members, first: _npy_header((8,), "|O") + bytes(64)})
    with pytest.raises(InvalidModelError, match="cannot be read as a skops file .*allow_pickle=False"):  # numpy's
        skflow.load(path)
    _write_archive(path, {**members, first: b"not an array"})
    with pytest.raises(InvalidModelError, match="cannot be read as a skops file .*magic string"):
        skflow.load(path)
    del members[first]
    _write_archive(path, members)
    with pytest.raises(InvalidModelError, match=f"cannot be read as a skops file \\(KeyError: '{first}'"):
        skflow.load(path)


def test_content_behind_a_flows_shared_id_is_refused_and_nesting_is_bounded(tmp_path):
    path, members, schema = _genuine(tmp_path)
    attributes = _flow_attributes(schema)
    # skops builds the first node of an id for all of them: the flow's weights are its configuration, or the reverse
    attributes["flow_"]["__id__"] = attributes["_flow_config"]["__id__"]
    _write_archive(path, {**members, "schema.json": json.dumps(schema).encode()})
    with pytest.raises(InvalidModelError, match="configuration must have the keys|weights must be a dict of numpy"):
        skflow.load(path)
    nested = {"__class__": "list", "__module__": "builtins", "__loader__": "ListNode", "content": []}
    for _ in range(300):
        nested = {**nested, "content": [nested]}
    _write_archive(path, {**members, "schema.json": json.dumps({**nested, "protocol": 2}).encode()})
    with pytest.raises(InvalidModelError, match="schema.json nests deeper than 200 levels"):
        skflow.load(path)


@pytest.mark.slow
def test_the_size_arithmetic_counts_the_real_flow():
    for n_features, n_levels, depth, hidden, coupling, permutation in itertools.product(
        [1, 2, 3, 8, 17], [1, 3, 5], [1, 2], [1, 7], ["additive", "affine"], ["reverse", "random", "lu"]
    ):
        config = dict(n_features=n_features, n_levels=n_levels, depth=depth, hidden_channels=hidden,
                      coupling=coupling, permutation=permutation)
        real = Glow(**config)
        assert flow_size(config) == (depth * len(real.sizes), sum(t.numel() for t in real.state_dict().values()))


# ---------------------------------------------------------------- loader edges: what is restored
def _fitted_flow():
    X = make_anisotropic_mixture(300, 8, random_state=0)
    return FlowGaussianizer(random_state=0, max_epochs=1).fit(X), X


def _with_trainer_state(flow, **changes):
    state = {**flow.__getstate__()["_trainer_state"], **changes}
    flow.__dict__.pop("_trainer", None)
    flow._trainer_state = {k: v for k, v in state.items() if v is not _MISSING}
    return flow


_MISSING = object()
N_PARAMETERS = sum(p.numel() for p in Glow(8).parameters())  # of _fitted_flow's
OPTIMISER_STATES = [
    ({"exp_avg": np.zeros(N_PARAMETERS + 1, np.float32)},
     rf"the optimiser state's exp_avg is float32\[{N_PARAMETERS + 1}\], "
     rf"the configuration needs float32\[{N_PARAMETERS}\]"),
    ({"exp_avg_sq": np.zeros(N_PARAMETERS, np.float64)}, r"the optimiser state's exp_avg_sq is float64\["),
    ({"exp_avg_sq": np.full(N_PARAMETERS, -1, np.float32)}, "the optimiser state's exp_avg_sq must be non-negative"),
    ({"exp_avg": np.full(N_PARAMETERS, np.nan, np.float32)}, "the optimiser state's moments must be finite"),
    ({"generator": np.zeros(10, np.uint8)}, r"the optimiser state's generator is uint8\[10\]"),
    ({"n_steps": -1}, "the optimiser state's n_steps must be a non-negative int"),
    ({"n_steps": "3"}, "the optimiser state's n_steps must be a non-negative int"),
    ({"reference_loss": float("nan")}, "the optimiser state's reference_loss must be a finite number or None"),
    ({"generator": _MISSING}, "the optimiser state must be a dict with the keys"),
]


@pytest.mark.parametrize("change, message", OPTIMISER_STATES, ids=lambda v: str(v)[:40])
def test_a_bad_optimiser_state_is_refused_at_load_not_in_the_next_partial_fit(tmp_path, change, message):
    flow, _ = _fitted_flow()
    path = skflow.dump(_with_trainer_state(flow, **change), tmp_path / "flow.skops")
    with pytest.raises(InvalidModelError, match=f"^{re.escape(str(path))}: {message}"):
        skflow.load(path)
    with pytest.raises(InvalidModelError, match=message):  # pickle and joblib restore through the same check
        pickle.loads(pickle.dumps(flow))


def test_fitted_attributes_and_weights_come_together(tmp_path):
    flow, X = _fitted_flow()
    del flow.flow_
    with pytest.raises(InvalidModelError, match="has fitted attributes .*n_features_in_.* but no flow weights"):
        skflow.load(skflow.dump(flow, tmp_path / "a.skops"))
    flow, X = _fitted_flow()
    del flow.n_features_in_
    with pytest.raises(InvalidModelError, match="has flow weights but not n_features_in_"):
        skflow.load(skflow.dump(flow, tmp_path / "b.skops"))
    flow, X = _fitted_flow()
    flow.loss_curve_ = "lots"
    with pytest.raises(InvalidModelError, match="loss_curve_ must be a list of numbers"):
        skflow.load(skflow.dump(flow, tmp_path / "c.skops"))
    unfitted = skflow.load(skflow.dump(FlowGaussianizer(depth=2), tmp_path / "d.skops"))
    assert unfitted.get_params()["depth"] == 2 and not hasattr(unfitted, "flow_")


def _bad_embedder():
    embedder = BertEmbedder()
    embedder.pooling = "no-such-pooling"
    return embedder


NESTED = {
    "in a FeatureUnion": lambda: FeatureUnion([("text", _bad_embedder())]),
    "in a ColumnTransformer in a Pipeline": lambda: make_pipeline(
        ColumnTransformer([("text", _bad_embedder(), 0)]), StandardScaler()),
    "in a fitted ColumnTransformer's transformers_": lambda: _with_fitted_transformers(
        ColumnTransformer([("text", BertEmbedder(), 0)]), [("text", _bad_embedder(), [0])]),
    "in a FeatureUnion in a FeatureUnion": lambda: FeatureUnion([("u", FeatureUnion([("e", _bad_embedder())]))]),
}


def _with_fitted_transformers(transformer, fitted):
    transformer.transformers_ = fitted
    return transformer


@pytest.mark.parametrize("where", list(NESTED))
def test_an_invalid_embedder_anywhere_inside_is_refused(tmp_path, where):
    path = skflow.dump(NESTED[where](), tmp_path / "model.skops")
    with pytest.raises(InvalidModelError, match="the saved BertEmbedder is invalid: The 'pooling' parameter"):
        skflow.load(path)


def _malformed(attribute, value, cls=Pipeline, init=None):
    def make():
        model = cls(init if init is not None else [("scale", StandardScaler())])
        setattr(model, attribute, value)
        return model
    return make


MALFORMED = [  # scikit-learn's own checks of the steps, which its fit makes
    (_malformed("steps", [("scale",)]), r"the saved Pipeline's steps are invalid: not enough values to unpack"),
    (_malformed("steps", "evil"), "The 'steps' parameter of Pipeline must be an instance of 'list'"),
    (_malformed("steps", [("a", "evil")]), "Pipeline's steps are invalid: Last step of Pipeline should implement fit"),
    (_malformed("steps", [("a", StandardScaler()), ("a", StandardScaler())]), "Names provided are not unique"),
    (_malformed("transformer_list", [("a", 3)], FeatureUnion),
     "FeatureUnion's transformer_list are invalid: All estimators should implement fit and transform. '3'"),
    (_malformed("transformers", [("a", StandardScaler())], ColumnTransformer, [("a", StandardScaler(), [0])]),
     r"ColumnTransformer's transformers are invalid: not enough values to unpack \(expected 3, got 2\)"),
    (_malformed("remainder", 7, ColumnTransformer, [("a", StandardScaler(), [0])]),
     "The 'remainder' parameter of ColumnTransformer must be"),
    (lambda: _with_fitted_transformers(ColumnTransformer([("a", StandardScaler(), [0])]), [("a", 3, [0])]),
     r"ColumnTransformer's transformers_ must be a list of \(name, transformer, columns\)"),
]


@pytest.mark.parametrize("make, message", MALFORMED, ids=lambda v: str(v)[:50])
def test_a_malformed_composite_is_refused(tmp_path, make, message):
    path = skflow.dump(make(), tmp_path / "model.skops")
    with pytest.raises(InvalidModelError, match=message):
        skflow.load(path)


def test_the_load_examples_run():
    import doctest

    import skflow.persistence
    import skflow.serving

    for function in (skflow.persistence.load, skflow.serving.load_sentence_transformer):
        finder = doctest.DocTestFinder()
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        for test in finder.find(function, function.__name__, globs={}):
            runner.run(test)
        results = runner.summarize(verbose=False)
        assert results.failed == 0 and results.attempted >= 2
