"""Text to tokens: ``zr convert --jsonl`` against the method of Megatron-LM's
``tools/preprocess_data.py`` — a ``multiprocessing`` pool of the Python ``tokenizers``
encoder over the lines, the main process writing a ``.bin`` of tokens and an ``.idx`` of
document lengths — on the same file, tokenizer and cores, in the same run::

    python -m zrecord.bench_tokenize --jsonl corpus.jsonl --tokenizer tokenizer.json [--zr PATH]

Both add the end-of-document token (``--eos``) and write uint16 tokens when the vocabulary
fits; their token files are compared byte for byte. The ratio is what to read: the machine
may be shared and noisy.

It also prints the conversion's peak resident memory beside the input's size. With
``--memory-limit-mib N`` (as root, where a cgroup memory controller is mounted) ``zr`` runs
under that limit, page cache included, so an input several times larger than the limit
shows the conversion streams; ``--only-zr`` leaves Megatron's method out.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import resource
import multiprocessing
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

_encoder = None


def _init(path: str, eos: str) -> None:
    global _encoder
    from tokenizers import Tokenizer  # noqa: PLC0415

    tokenizer = Tokenizer.from_file(path)
    _encoder = (tokenizer, tokenizer.token_to_id(eos))


def _encode(line: str) -> list[int]:
    tokenizer, eos = _encoder
    text = json.loads(line)["text"]
    return tokenizer.encode(text, add_special_tokens=False).ids + [eos]


def megatron_like(jsonl: str, tokenizer: str, eos: str, out: str, workers: int) -> tuple[int, int]:
    """Documents and tokens written, Megatron's way (a pool's imap, chunksize 25)."""
    docs = tokens = 0
    sizes = []
    with open(jsonl, encoding="utf-8") as lines, open(out + ".bin", "wb") as bin_file, multiprocessing.Pool(workers, initializer=_init, initargs=(tokenizer, eos)) as pool:
        for ids in pool.imap(_encode, lines, 25):
            bin_file.write(np.array(ids, dtype=np.uint16).tobytes())
            sizes.append(len(ids))
            docs += 1
            tokens += len(ids)
    np.array(sizes, dtype=np.int32).tofile(out + ".idx")
    return docs, tokens


def _memory_cgroup(limit_mib: int) -> str:
    """A fresh cgroup holding at most ``limit_mib`` MiB (v2's memory.max or v1's
    memory.limit_in_bytes); its directory. Refused with a clear error where none can be made."""
    for base, limit in (("/sys/fs/cgroup", "memory.max"), ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")):
        if os.path.exists(os.path.join(base, limit)) or (limit == "memory.limit_in_bytes" and os.path.isdir(base)):
            group = os.path.join(base, f"zrecord-bench-{os.getpid()}")
            try:
                os.makedirs(group, exist_ok=True)
                with open(os.path.join(group, limit), "w") as f:
                    f.write(str(limit_mib << 20))
                if limit == "memory.limit_in_bytes" and os.path.exists(os.path.join(group, "memory.memsw.limit_in_bytes")):
                    with open(os.path.join(group, "memory.memsw.limit_in_bytes"), "w") as f:
                        f.write(str(limit_mib << 20))
                return group
            except OSError as e:
                raise SystemExit(f"cannot make a memory cgroup under {base} ({e}): --memory-limit-mib needs root and a memory controller")
    raise SystemExit("no cgroup memory controller is mounted: --memory-limit-mib cannot be honoured")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jsonl", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--eos", default="</s>")
    parser.add_argument("--zr", default=shutil.which("zr") or "zr")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--memory-limit-mib", type=int, default=None)
    parser.add_argument("--only-zr", action="store_true")
    args = parser.parse_args()
    size = os.path.getsize(args.jsonl)
    group = _memory_cgroup(args.memory_limit_mib) if args.memory_limit_mib else None

    def enter() -> None:
        if group is not None:
            with open(os.path.join(group, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        done = subprocess.run([args.zr, "convert", os.path.join(tmp, "stream"), "--jsonl", args.jsonl, "--tokenizer", args.tokenizer, "--eos", args.eos], capture_output=True, text=True, preexec_fn=enter)
        ours = time.perf_counter() - started
        if group is not None:
            os.rmdir(group)
        if done.returncode != 0:
            raise SystemExit(f"zr convert failed: {done.stderr.strip()}")
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10
        stream_tokens = int(done.stdout.split(" documents, ")[1].split(" tokens")[0])
        limit = f", under a {args.memory_limit_mib} MiB memory limit" if group else ""
        print(f"zr convert --jsonl: {stream_tokens:,} tokens from {size / (1 << 20):.0f} MiB of JSON lines in {ours:.1f} s ({stream_tokens / ours:,.0f} tokens/s){limit}; peak resident memory {peak / (1 << 20):.0f} MiB for {size / (1 << 20):.0f} MiB of input")
        if args.only_zr:
            return
        started = time.perf_counter()
        docs, tokens = megatron_like(args.jsonl, args.tokenizer, args.eos, os.path.join(tmp, "megatron"), args.workers)
        theirs = time.perf_counter() - started
        # The same tokens, in the same order: the stream's token file is the tokens as they
        # lie, as Megatron's .bin is.
        if not filecmp.cmp(os.path.join(tmp, "stream", "tokens.bin"), os.path.join(tmp, "megatron.bin"), shallow=False):
            raise SystemExit("zr convert and Megatron's method made different tokens")
    assert tokens == stream_tokens, (tokens, stream_tokens)
    print(f"{docs:,} documents, {tokens:,} tokens, {size / (1 << 20):.0f} MiB of JSON lines, {args.workers} cores:")
    print(f"  zr convert --jsonl            {tokens / ours:>12,.0f} tokens/s  {size / ours / (1 << 20):7.1f} MiB/s  ({ours:.1f} s)")
    print(f"  Megatron's method (a pool)    {tokens / theirs:>12,.0f} tokens/s  {size / theirs / (1 << 20):7.1f} MiB/s  ({theirs:.1f} s)")
    print(f"  zr / Megatron's method        {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
