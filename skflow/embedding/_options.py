"""Hugging Face loading options of `BertEmbedder`: prompt, ``trust_remote_code``, ``token``, ``model_kwargs``.

Checked here, before anything is loaded, and turned into what transformers takes:

- ``trust_remote_code`` is passed on only when True (transformers' default
  stays in charge otherwise);
- ``token`` is passed on only when given, never stored: `HiddenToken` is a
  string whose value is ``***`` with the token kept aside, so every printed,
  logged or JSON form of the parameters shows the mask; the estimator drops it
  from its pickled state;
- ``model_kwargs`` may hold only the keys in `MODEL_KWARGS`, with plain JSON
  values, so that they can be saved, compared and hashed into the cache key;
  a key that has its own parameter (``dtype``, ``token``,
  ``trust_remote_code``, ``revision``) is refused with the parameter to use.
"""

import json
import math

# model_kwargs keys skflow passes to ``AutoModel.from_pretrained``, and whether they can change the vectors
# (those that can are part of the embedding cache's key).
MODEL_KWARGS = {
    "attn_implementation": True,  # "eager", "sdpa", "flash_attention_2": other kernels, other rounding
    "variant": True,  # another weights file (e.g. "fp16")
    "use_safetensors": True,  # which weights file is read
    "device_map": False,  # placement only (needs the accelerate package)
    "max_memory": False,
    "low_cpu_mem_usage": False,
}
# keys that are BertEmbedder parameters, or transformers options skflow owns: refused with the parameter to use
OWN_PARAMETERS = {
    "trust_remote_code": "the trust_remote_code parameter",
    "token": "the token parameter",
    "use_auth_token": "the token parameter",
    "revision": "the revision parameter",
    "dtype": "the dtype parameter",
    "torch_dtype": "the dtype parameter",
    "output_hidden_states": "the pooling and layers parameters",
    "local_files_only": "the HF_HUB_OFFLINE environment variable",
    "subfolder": "model_name_or_path: give the subfolder's own path (its files are what the identity hashes)",
}
PROMPT_MAX_CHARS = 4096
# BertEmbedder's parameters added after skflow 0.1.0, and their defaults: what a file saved before has
NEW_PARAMETER_DEFAULTS = {"prompt": None, "trust_remote_code": False, "token": None, "model_kwargs": None}


class HiddenToken(str):
    """A Hugging Face token whose every printed form is ``***``: its string value IS the mask.

    ``str``, ``repr``, f-strings, ``json.dumps``, logging and ``.encode()``
    all see ``'***'``; the token itself is kept aside and only `reveal` gives
    it (skflow calls it where it hands the token to huggingface_hub). Two
    HiddenTokens are equal when their tokens are. Copying (``copy.copy``,
    ``copy.deepcopy``, scikit-learn's ``clone``) returns the same object;
    pickling is refused.
    """

    MASK = "***"

    def __new__(cls, token: str):
        hidden = super().__new__(cls, cls.MASK)
        hidden.__dict__["_token"] = str.__str__(token) if not isinstance(token, HiddenToken) else token.reveal()
        return hidden

    def reveal(self) -> str:
        """The token itself, for huggingface_hub."""
        return self.__dict__["_token"]

    def __repr__(self) -> str:
        return f"'{self.MASK}'"

    def __eq__(self, other) -> bool:
        return isinstance(other, HiddenToken) and other.reveal() == self.reveal()

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((HiddenToken, self.reveal()))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("a Hugging Face token is never pickled")


def hide_token(token):
    """``token`` as a `HiddenToken` if it is a string, else as it is (None, True, False)."""
    return HiddenToken(token) if isinstance(token, str) and not isinstance(token, HiddenToken) else token


def reveal_token(token):
    """The token to hand to huggingface_hub: a `HiddenToken`'s own value, anything else as it is."""
    return token.reveal() if isinstance(token, HiddenToken) else token


def check_prompt(prompt) -> str | None:
    """``prompt`` if it is None or a string of at most `PROMPT_MAX_CHARS` valid Unicode characters."""
    if prompt is None:
        return None
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str or None, got a {type(prompt).__name__}")
    if len(prompt) > PROMPT_MAX_CHARS:
        raise ValueError(f"prompt has {len(prompt)} characters, more than {PROMPT_MAX_CHARS}")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("prompt is not valid Unicode (it has a lone surrogate)") from None
    return prompt


def check_token(token) -> None:
    """A token is None, a bool (True: the token saved by ``hf auth login``) or a non-empty string."""
    if token is None or isinstance(token, bool):
        return
    token = reveal_token(token)
    if not isinstance(token, str):
        raise TypeError(f"token must be a str, a bool or None, got a {type(token).__name__}")
    if not token.strip() or any(c.isspace() for c in token):
        raise ValueError("token must be a non-empty string without spaces (its value is not shown)")


def check_model_kwargs(model_kwargs) -> dict:
    """``model_kwargs`` as a plain dict of known keys and JSON values; a clear error otherwise."""
    if model_kwargs is None:
        return {}
    if not isinstance(model_kwargs, dict):
        raise TypeError(f"model_kwargs must be a dict or None, got a {type(model_kwargs).__name__}")
    for key in model_kwargs:
        if not isinstance(key, str):
            raise TypeError(f"model_kwargs keys must be strings, got {key!r}")
        if key in OWN_PARAMETERS:
            raise ValueError(f"model_kwargs may not set {key!r}: use {OWN_PARAMETERS[key]} instead")
        if key not in MODEL_KWARGS:
            raise ValueError(f"model_kwargs has an unknown key {key!r}; skflow passes on only {sorted(MODEL_KWARGS)}")
        _check_plain(model_kwargs[key], f"model_kwargs[{key!r}]")
    check_attention(model_kwargs.get("attn_implementation"))
    return dict(model_kwargs)


def check_attention(value, where: str = "model_kwargs['attn_implementation']") -> None:
    """Only transformers' own attention kernels that run here as they are.

    Another name (``"org/repo"``) makes transformers fetch and run a hub
    kernel; so does ``flash_attention_N`` when its package is not installed
    and the ``kernels`` package is (transformers then fetches
    ``kernels-community/flash-attn*`` instead). ``where`` names the setting in
    the error: a parameter, or a model folder's ``config.json``.
    """
    if value is None:
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    own = {"eager", *(name for name in ALL_ATTENTION_FUNCTIONS.valid_keys() if "/" not in name)}
    allowed = own - _flash_kernels_not_installed(own)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{where} must be one of transformers' own kernels installed here "
                         f"({', '.join(sorted(allowed))}), got {value!r}: a kernel from the hub would run its code")


def _flash_kernels_not_installed(names) -> set[str]:
    """The ``flash_attention_N`` names whose package is missing (all of them where transformers cannot say)."""
    flash = {name for name in names if name.startswith("flash_attention_")}
    try:
        from transformers import modeling_flash_attention_utils as flash_utils

        matrix = flash_utils.FLASH_ATTENTION_COMPATIBILITY_MATRIX
        return {name for name in flash if not matrix[int(name.rsplit("_", 1)[1])]["general_availability_check"]()}
    except (ImportError, AttributeError, KeyError, ValueError, TypeError):
        return flash


def _check_plain(value, where: str, depth: int = 0) -> None:
    if depth > 4:
        raise ValueError(f"{where} nests too deep")
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float) and math.isfinite(value):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"{where} has a key {key!r} that is not a string or an int")
            _check_plain(item, f"{where}[{key!r}]", depth + 1)
        return
    raise TypeError(
        f"{where} must be a plain value (None, bool, int, finite float, str, or a dict of them), got a "
        f"{type(value).__name__}"
    )


def check_hub_options(embedder) -> None:
    """The checks of a `BertEmbedder`'s prompt, token and model_kwargs that its constraints cannot express."""
    check_prompt(embedder.prompt)
    check_token(embedder.token)
    check_model_kwargs(embedder.model_kwargs)


def model_kwargs_key(model_kwargs: dict) -> dict:
    """The entries of checked ``model_kwargs`` that can change the vectors (for the cache key)."""
    return {key: value for key, value in model_kwargs.items() if MODEL_KWARGS[key]}


def frozen_kwargs(model_kwargs: dict) -> str:
    """Checked ``model_kwargs`` as a canonical JSON string: hashable, for the in-process model registry."""
    return json.dumps(model_kwargs, sort_keys=True)


def hub_kwargs(trust_remote_code: bool, token) -> tuple:
    """What transformers and huggingface_hub get: ``trust_remote_code`` only when True, ``token`` only when set.

    A hashable tuple of pairs, the token revealed (transformers sends it as it is): it lives in memory only,
    in the in-process model registry's key, never in a file, a log or the embedding cache's key.
    """
    options = []
    if bool(trust_remote_code):
        options.append(("trust_remote_code", True))
    if token is not None and token is not False:
        options.append(("token", reveal_token(token)))
    return tuple(options)
