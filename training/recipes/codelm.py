"""codelm: a small GPT trained on Python's own standard library sources, tokenized with a local byte-level BPE.

The corpus is on every machine that has Python: the ``.py`` files under
``sysconfig.get_paths()["stdlib"]``, walked in sorted order, minus site-packages, test suites
and generated tables, capped by ``max_files`` / ``max_bytes``. Files are split into train and
validation by file (every ``val_every``-th selected file is validation), so no text leaks across.
A byte-level BPE tokenizer is trained on the training files only; its JSON rides along in the
dataset's metadata so a run is self-describing. Examples are non-overlapping windows of
``seq_len + 1`` token ids (uint16); the model predicts each next token.

Note: the corpus depends on the Python version (3.11's stdlib is not 3.12's). The cache key
hashes file contents, so a node with another Python preprocesses its own shards instead of
silently training on different data under the same key.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from training.recipes.base import Dataset, EmptyDataError, Recipe, RecipeParams, StepOutput

EOT = "<|endoftext|>"  # separates files in the token stream; id 0 in the vocabulary
DEFAULT_EXCLUDE = ("site-packages", "test", "tests", "idlelib", "lib2to3", "encodings", "__pycache__")


class CodeLMParams(RecipeParams):
    # ---- corpus
    max_files: int | None = Field(
        None, ge=2, description="Use at most this many .py files (sorted by relative path); null = no file cap."
    )
    max_bytes: int = Field(
        3_000_000, ge=1_000,
        description="Stop adding files (in sorted order) before their total size would exceed this many bytes.",
    )
    exclude_dirs: tuple[str, ...] = Field(
        DEFAULT_EXCLUDE, description="Directory names skipped anywhere in the stdlib tree (tests, generated tables)."
    )
    val_every: int = Field(10, ge=2, description="Every N-th selected file (by sorted path) goes to validation.")
    # ---- tokenizer
    vocab_size: int = Field(2048, ge=300, le=65_535, description="Byte-level BPE vocabulary size (tokens; ids are uint16).")
    min_frequency: int = Field(2, ge=1, description="BPE merges need a pair seen at least this often.")
    tokenizer_max_bytes: int | None = Field(
        None, ge=1_000, description="Train the BPE on the training files only up to this many bytes (in sorted "
        "order), so a corpus that grows night by night keeps its token ids (and a warm start their meaning); null = "
        "on every training file.")
    # ---- examples and model
    seq_len: int = Field(128, ge=8, le=8192, description="Tokens of context per example (each example holds seq_len + 1).")
    n_layer: int = Field(3, ge=1, description="Transformer blocks.")
    n_head: int = Field(4, ge=1, description="Attention heads per block (must divide n_embd).")
    n_embd: int = Field(128, ge=8, description="Model width (embedding dimension).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout probability (embeddings, attention, residuals).")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "CodeLMParams":
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head ({self.n_head}) must divide n_embd ({self.n_embd})")
        return self


# ------------------------------------------------------------------------------------ corpus


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def select_files(params: CodeLMParams) -> list[tuple[str, Path]]:
    """(relative posix path, absolute path) of exactly the files the params select, in sorted order."""
    root = stdlib_root()
    excluded = set(params.exclude_dirs)
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in excluded)
        for name in filenames:
            # _sysconfigdata*.py describes this machine's build, not Python code anyone writes
            if name.endswith(".py") and not name.startswith("_sysconfigdata"):
                path = Path(dirpath) / name
                if path.is_file():
                    found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda item: item[0])
    selected, total = [], 0
    for rel, path in found:
        if params.max_files is not None and len(selected) >= params.max_files:
            break
        size = path.stat().st_size
        if total + size > params.max_bytes:
            break
        selected.append((rel, path))
        total += size
    return selected


def fingerprint_raw(params: CodeLMParams) -> str:
    """sha256 over (relative path, content) of the selected files: content, never mtimes."""
    h = hashlib.sha256()
    for rel, path in select_files(params):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


# ------------------------------------------------------------------------------------ preprocessing


def train_tokenizer(texts: list[str], vocab_size: int, min_frequency: int):
    """A byte-level BPE trained on ``texts``; deterministic for the same texts in the same order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def load_tokenizer(meta: dict[str, Any]):
    """The run's tokenizer from the dataset metadata (e.g. to decode samples)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(meta["tokenizer_json"])


def _stream(tok, texts: list[str], eot_id: int) -> np.ndarray:
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot_id)
    return np.asarray(ids, dtype=np.uint16)


def _windows(stream: np.ndarray, width: int) -> np.ndarray:
    n = len(stream) // width
    return np.ascontiguousarray(stream[: n * width].reshape(n, width))


def unigram_entropy_nats(tokens: np.ndarray, vocab_size: int) -> float:
    counts = np.bincount(tokens.reshape(-1).astype(np.int64), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def _first_bytes(texts: list[str], limit: int | None) -> list[str]:
    """The leading texts whose sizes add up to at most ``limit`` bytes (at least one); all of them without one."""
    if limit is None:
        return texts
    out, total = [], 0
    for text in texts:
        total += len(text.encode("utf-8"))
        if out and total > limit:
            break
        out.append(text)
    return out


def preprocess(params: CodeLMParams) -> Dataset:
    files = select_files(params)
    train_texts, val_texts, val_names = [], [], []
    for i, (rel, path) in enumerate(files):
        text = path.read_bytes().decode("utf-8", errors="replace")
        if i % params.val_every == params.val_every - 1:
            val_texts.append(text)
            val_names.append(rel)
        else:
            train_texts.append(text)
    if not train_texts or not val_texts:
        raise EmptyDataError(
            f"codelm selected {len(files)} stdlib files (max_files={params.max_files}, max_bytes={params.max_bytes}) "
            f"and every {params.val_every}th goes to validation, so {'training' if not train_texts else 'validation'} "
            "gets none. Raise recipe_params.max_bytes / max_files or lower recipe_params.val_every."
        )
    tok = train_tokenizer(_first_bytes(train_texts, params.tokenizer_max_bytes), params.vocab_size, params.min_frequency)
    eot_id = tok.token_to_id(EOT)
    vocab = tok.get_vocab_size()
    width = params.seq_len + 1
    train = _windows(_stream(tok, train_texts, eot_id), width)
    val = _windows(_stream(tok, val_texts, eot_id), width)
    for split, arr in (("train", train), ("val", val)):
        if len(arr) == 0:
            raise EmptyDataError(
                f"codelm's {split} files hold fewer than seq_len + 1 = {width} tokens. "
                "Raise recipe_params.max_bytes / max_files or lower recipe_params.seq_len."
            )
    return Dataset(
        splits={"train": {"tokens": train}, "val": {"tokens": val}},
        meta={
            "vocab_size": vocab,
            "seq_len": params.seq_len,
            "eot_id": eot_id,
            "files": len(files),
            "train_files": len(train_texts),
            "val_files": len(val_texts),
            "val_file_names": val_names,
            "corpus_bytes": sum(len(t.encode("utf-8")) for t in train_texts + val_texts),
            "train_tokens": int(train.size),
            "val_tokens": int(val.size),
            "unigram_entropy_nats": round(unigram_entropy_nats(train, vocab), 6),
            "python_stdlib": stdlib_root().name,
            "tokenizer_json": tok.to_str(),
        },
    )


# ------------------------------------------------------------------------------------ model


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln2(x)))))


class CodeGPT(nn.Module):
    """GPT-style decoder: token + learned position embeddings, pre-LN blocks, output tied to the input embedding."""

    def __init__(self, vocab_size: int, seq_len: int, n_layer: int, n_head: int, n_embd: int, dropout: float):
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(seq_len, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by depth
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than the model's context of {self.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model(params: CodeLMParams, meta: dict[str, Any]) -> nn.Module:
    return CodeGPT(meta["vocab_size"], meta["seq_len"], params.n_layer, params.n_head, params.n_embd, params.dropout)


def step(model: nn.Module, batch: dict[str, torch.Tensor]) -> StepOutput:
    tokens = batch["tokens"]
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    correct = (logits.detach().argmax(dim=-1) == targets).sum().item()
    return StepOutput(loss=loss, count=int(targets.numel()), sums={"correct_tokens": float(correct)})


def flops_per_example(params: CodeLMParams, meta: dict[str, Any]) -> float:
    """Training FLOPs of one window, as nanoGPT's estimate_mfu counts them (PaLM appendix B): 6 per parameter per
    token (forward 2, backward 4), position embeddings left out, plus attention's 12 x layers x width x context."""
    d, n_layer, t = params.n_embd, params.n_layer, meta["seq_len"]
    n_params = meta["vocab_size"] * d + n_layer * (12 * d * d + 13 * d) + 2 * d  # tied head; biases and LayerNorms
    return float(t * (6 * n_params + 12 * n_layer * d * t))


def summary_fields(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "unigram_entropy_nats": meta["unigram_entropy_nats"],
        "vocab_size": meta["vocab_size"],
        "train_tokens": meta["train_tokens"],
        "val_tokens": meta["val_tokens"],
        "corpus_files": meta["files"],
    }


def recipe() -> Recipe:
    return Recipe(
        name="codelm",
        params_model=CodeLMParams,
        fingerprint_raw=fingerprint_raw,
        preprocess=preprocess,
        build_model=build_model,
        step=step,
        metrics={"token_accuracy": "correct_tokens"},
        summary_fields=summary_fields,
        blocks=lambda model: model.blocks,  # the transformer blocks: what activation checkpointing recomputes
        flops_per_example=flops_per_example,
    )
