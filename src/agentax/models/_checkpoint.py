"""Load and save Hugging Face safetensors checkpoints as `Transformer`s.

`load_pretrained` reads a local directory (config.json plus model.safetensors, or shards listed
in model.safetensors.index.json). It builds the module abstractly with `nnx.eval_shape` and
fills each parameter from its tensor, so a large model is never initialised randomly first and
at most one tensor is held twice on the host at a time. `save_pretrained` writes the same
layout, which `transformers.AutoModelForCausalLM.from_pretrained` loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from agentax.models._config import ModelConfig
from agentax.models._hf_config import config_from_hf, config_to_hf
from agentax.models._params import TEXT_PREFIXES, hf_param_table, is_ignorable_hf_tensor
from agentax.models._transformer import Transformer

__all__ = ["load_pretrained", "save_pretrained", "read_hf_config"]

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def read_hf_config(path: str | os.PathLike, *, strict: bool = True) -> ModelConfig:
    """The `ModelConfig` of the checkpoint directory `path` (reads only config.json)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"checkpoint path '{path}' is not a directory; agentax loads local Hugging Face "
            "checkpoints (config.json + *.safetensors), e.g. from "
            "`hf download <repo> --local-dir DIR`"
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no config.json in checkpoint directory '{path}'")
    try:
        data = json.loads(config_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{config_file} is not valid JSON ({e}); restore the checkpoint's "
                         "config.json") from None
    if not isinstance(data, dict):
        raise ValueError(f"{config_file} holds a JSON {type(data).__name__}, not an object of "
                         "model settings; restore the checkpoint's config.json")
    try:
        return config_from_hf(data, strict=strict)
    except (TypeError, KeyError, AttributeError) as e:  # a field of the wrong JSON type
        raise ValueError(f"{config_file}: a field has the wrong type ({type(e).__name__}: {e}); "
                         "compare it with the model's published config.json") from None


def _open_tensors(file: Path):
    """`safe_open(file)`, with an error naming the file when it is not valid safetensors."""
    try:
        return safe_open(file, framework="numpy")
    except Exception as e:  # safetensors raises its own SafetensorError (and OSError)
        raise ValueError(f"{file} is not a readable safetensors file ({' '.join(str(e).split())})"
                         "; it may be truncated: download or export it again") from None


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file holding it."""
    index = path / _INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            weight_map = {str(k): str(v) for k, v in weight_map.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{index} is not a safetensors index (a JSON object with a "
                             "'weight_map' object); restore it from the checkpoint") from None
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise FileNotFoundError(f"{_INDEX} in '{path}' lists missing shard file(s) {missing}")
        return {name: path / f for name, f in weight_map.items()}
    single = path / _SINGLE
    if single.is_file():
        with _open_tensors(single) as f:
            return {name: single for name in f.keys()}
    others = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
    raise FileNotFoundError(
        f"no {_SINGLE} or {_INDEX} in '{path}'"
        + (f" (found {others}: convert them to safetensors with transformers' save_pretrained)"
           if others else "")
    )


def _pick_prefix(names: set[str]) -> str:
    for prefix in TEXT_PREFIXES:
        if f"{prefix}embed_tokens.weight" in names:
            return prefix
    raise ValueError(
        "checkpoint has no embedding tensor (looked for "
        f"{[p + 'embed_tokens.weight' for p in TEXT_PREFIXES]}); it is not a supported "
        "Llama / Qwen / Gemma 3 text checkpoint"
    )


def _as_param(array: np.ndarray, name: str, spec, target: jax.ShapeDtypeStruct,
              sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    if array.dtype not in (np.float32, np.float16, ml_dtypes.bfloat16):
        raise ValueError(
            f"tensor '{name}' has dtype {array.dtype}; agentax loads float32 / bfloat16 / "
            "float16 checkpoints (dequantise it first)"
        )
    expected = tuple(target.shape)[::-1] if spec.transpose else tuple(target.shape)
    if tuple(array.shape) != expected:
        raise ValueError(
            f"tensor '{name}' has shape {tuple(array.shape)} but config.json implies {expected}; "
            "config.json does not describe these weights (check hidden_size, intermediate_size, "
            "num_attention_heads, num_key_value_heads, head_dim, vocab_size)"
        )
    if spec.transpose:
        array = array.T  # a view: each shard below copies only its own slice
    if sharding is None:
        return jnp.asarray(np.ascontiguousarray(array).astype(target.dtype))
    return jax.make_array_from_callback(
        tuple(array.shape), sharding,
        lambda index: np.ascontiguousarray(array[index]).astype(target.dtype))


def load_pretrained(
    path: str | os.PathLike,
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    strict: bool = True,
    shardings: Callable[[str, tuple[int, ...]], jax.sharding.Sharding] | None = None,
) -> Transformer:
    """A `Transformer` holding the weights of a local Hugging Face checkpoint directory.

    Args:
      path: directory with config.json and model.safetensors, or sharded
        model-0000i-of-0000n.safetensors with model.safetensors.index.json.
      dtype: compute dtype ('float32' / 'bfloat16'); default: the checkpoint's dtype.
      param_dtype: parameter storage dtype; default: `dtype` if given, else the checkpoint's.
      strict: passed to `config_from_hf` (False: unknown config fields only warn).
      shardings: where each parameter goes: called with its path joined by '/' (e.g.
        'layers/0/attn/q_proj/kernel') and its shape, it returns a `jax.sharding.Sharding`,
        and each device receives only its slice of the tensor, read from the host (the model
        is never staged whole on one device). `agentax.train.param_sharding_fn(mesh)` gives
        the trainer's layout. Default: every parameter on the default device.

    Returns:
      The model; `model.config` is the parsed config.

    Raises:
      ValueError / FileNotFoundError naming the file, config field or tensor that is wrong:
      unknown architecture, missing or unexpected tensor, shape mismatch.
    """
    path = Path(path)
    config = read_hf_config(path, strict=strict)
    overrides = {}
    if dtype is not None:
        overrides.update(dtype=dtype, param_dtype=dtype)
    if param_dtype is not None:
        overrides["param_dtype"] = param_dtype
    bad = {k: v for k, v in overrides.items() if v not in _NP_DTYPES}
    if bad:
        raise ValueError(f"unsupported {bad}; use 'float32' or 'bfloat16'")
    config = dataclasses.replace(config, **overrides)

    files = _tensor_files(path)
    prefix = _pick_prefix(set(files))
    table = hf_param_table(config, prefix)
    missing = sorted(set(table) - set(files))
    if missing:
        raise ValueError(
            f"checkpoint '{path}' lacks tensor '{missing[0]}'"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; config.json does not match the weights (check num_hidden_layers, "
            "tie_word_embeddings, attention_bias, mlp_bias) or the download is incomplete"
        )
    extra = sorted(
        n for n in set(files) - set(table) if not is_ignorable_hf_tensor(n, config, prefix)
    )
    if extra:
        raise ValueError(
            f"checkpoint '{path}' has unexpected tensor '{extra[0]}'"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            + "; the weights hold parameters this config does not use (check config.json: "
            "tie_word_embeddings, attention_bias, mlp_bias, num_hidden_layers)"
        )

    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    targets = dict(nnx.to_flat_state(abstract_state))
    filled = {}
    by_file: dict[Path, list[str]] = {}
    for name in table:
        by_file.setdefault(files[name], []).append(name)
    for file, names in by_file.items():
        with _open_tensors(file) as f:
            for name in names:
                spec = table[name]
                var = targets[spec.path]
                try:
                    tensor = f.get_tensor(name)
                except Exception as e:  # a damaged data section
                    raise ValueError(f"{file}: tensor '{name}' cannot be read ({e}); the file "
                                     "may be truncated: download or export it again") from None
                sharding = None if shardings is None else shardings(
                    "/".join(str(p) for p in spec.path), tuple(var.value.shape))
                array = _as_param(tensor, name, spec, var.value, sharding)
                filled[spec.path] = var.replace(array)
    left = sorted(set(targets) - set(filled))
    if left:  # a table/model mismatch: a bug in agentax, not in the checkpoint
        raise RuntimeError(f"agentax param table does not cover model parameters {left}")
    state = nnx.from_flat_state([(p, filled[p]) for p in targets])
    return nnx.merge(graphdef, state)


def _shards(sizes: dict[str, int], max_shard_bytes: int) -> list[list[str]]:
    shards, current, used = [], [], 0
    for name, size in sizes.items():
        if current and used + size > max_shard_bytes:
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    if current:
        shards.append(current)
    return shards


def save_pretrained(
    model: Transformer,
    path: str | os.PathLike,
    *,
    tokenizer: Any | None = None,
    max_shard_bytes: int = 5 * 2**30,
) -> None:
    """Writes `model` as a Hugging Face checkpoint directory that `transformers` loads.

    Args:
      model: the model to save; its `config.family` picks the Hugging Face architecture.
      path: output directory (created if needed). Old model*.safetensors files and the index
        there are removed so the directory holds one checkpoint.
      tokenizer: the model's tokenizer (anything with `eos_token_ids`, `bos_token_id` and
        `pad_token_id`, e.g. an `agentax.text.Tokenizer`). Its ids go into config.json and
        generation_config.json, so `transformers` `generate` stops at the end of a turn;
        without it neither file names them. An existing generation_config.json in `path`
        keeps its other settings (sampling defaults) and gets these ids.
      max_shard_bytes: largest shard; more bytes give model-0000i-of-0000n.safetensors files
        and model.safetensors.index.json. A single tensor larger than this gets its own shard.

    Tensors are stored in `config.param_dtype` (cast on the host, one tensor at a time: the
    model may hold float32 master weights). Each tensor is fetched to the host on its own, so
    at most one shard's tensors are on the host; a model sharded over several processes
    (`jax.distributed`) is all-gathered tensor by tensor, and process 0 writes the files: call
    it on every process then.
    """
    config: ModelConfig = model.config
    hf_config = config_to_hf(config)
    token_ids = _token_ids(tokenizer) if tokenizer is not None else {}
    hf_config.update(token_ids)
    table = hf_param_table(config)
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    np_dtype = _NP_DTYPES[config.param_dtype]
    sizes = {
        name: int(np.prod(flat[spec.path].value.shape)) * np.dtype(np_dtype).itemsize
        for name, spec in table.items()
    }
    shards = _shards(sizes, max_shard_bytes)
    path = Path(path)
    writer = jax.process_index() == 0
    if writer:
        path.mkdir(parents=True, exist_ok=True)
        for old in path.iterdir():
            if old.name in (_SINGLE, _INDEX) or _SHARD_RE.match(old.name):
                old.unlink()
    weight_map = {}
    for i, names in enumerate(shards):
        file = (
            _SINGLE if len(shards) == 1
            else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        tensors = {}
        for name in names:
            spec = table[name]
            array = _to_host(flat[spec.path].value).astype(np_dtype)
            weight_map[name] = file
            if writer:
                tensors[name] = np.ascontiguousarray(array.T if spec.transpose else array)
        if writer:
            save_file(tensors, path / file, metadata={"format": "pt"})
    if not writer:
        return
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        (path / _INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (path / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    if token_ids:
        generation_file = path / "generation_config.json"
        generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
        generation.update(token_ids)
        generation_file.write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")


def _to_host(x) -> np.ndarray:
    """One tensor on the host; all-gathered when it spans processes (a collective)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _token_ids(tokenizer: Any) -> dict[str, Any]:
    """bos/eos/pad ids of `tokenizer` as config.json writes them (one eos id as an int)."""
    eos = [int(i) for i in tokenizer.eos_token_ids]
    if not eos:
        raise ValueError("the tokenizer has no eos_token_ids; generate could never stop")
    bos = tokenizer.bos_token_id
    return {"bos_token_id": None if bos is None else int(bos),
            "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": int(tokenizer.pad_token_id)}
