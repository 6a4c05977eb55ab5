"""Inputs in an object store: `zr convert` reads JSON lines, Parquet files and tar shards
from s3:// URLs of a local S3-compatible server (moto's, started here), in ranges, and
makes what the same files make from the disk."""

import gzip
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest

import zrecord

TOKENIZER = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
    "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "</s>": 1, "the": 2, "cat": 3, "sat": 4}, "unk_token": "[UNK]"},
}


@pytest.fixture
def s3():
    pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("moto's S3 server did not start")
                time.sleep(0.2)
        endpoint = f"http://127.0.0.1:{port}"
        env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true"}
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
        client.create_bucket(Bucket="corpus")
        yield client, env
    finally:
        server.terminate()
        server.wait(10)


def test_zr_convert_reads_inputs_from_s3(tmp_path, s3, zr_binary):
    zr = zr_binary
    if zr is None:
        pytest.skip("the zr binary is not built")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    client, env = s3
    run_env = {**os.environ, **env}
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text(json.dumps(TOKENIZER))
    words = ["the", "cat", "sat"]
    texts = [" ".join(words[(k + w) % 3] for w in range(k % 9)) for k in range(3000)]
    body = gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    client.put_object(Bucket="corpus", Key="text/a.jsonl.gz", Body=body)
    (tmp_path / "a.jsonl.gz").write_bytes(body)

    # JSON lines: the same stream as from the disk.
    for source, dest in (("s3://corpus/text/a.jsonl.gz", "remote"), (str(tmp_path / "a.jsonl.gz"), "local")):
        done = subprocess.run([zr, "convert", str(tmp_path / dest), "--jsonl", source, "--tokenizer", str(tokenizer), "--eos", "</s>"], capture_output=True, text=True, env=run_env)
        assert done.returncode == 0, done.stderr
    remote, local = zrecord.open_stream(tmp_path / "remote"), zrecord.open_stream(tmp_path / "local")
    assert remote.documents == local.documents == 3000
    for k in (0, 1, 8, 1234, 2999):
        np.testing.assert_array_equal(remote.document(k), local.document(k))

    # Parquet: read where the reader asks, in ranges.
    rng = np.random.default_rng(4)
    blobs = [rng.integers(0, 256, size=int(rng.integers(0, 4000)), dtype=np.uint8).tobytes() for _ in range(2000)]
    table = pa.table({"blob": pa.array(blobs, pa.binary()), "label": pa.array(np.arange(2000, dtype=np.int64))})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=300, compression="zstd")
    client.put_object(Bucket="corpus", Key="tables/t.parquet", Body=sink.getvalue())
    done = subprocess.run([zr, "convert", str(tmp_path / "table"), "--parquet", "s3://corpus/tables/t.parquet"], capture_output=True, text=True, env=run_env)
    assert done.returncode == 0, done.stderr
    ds = zrecord.open(tmp_path / "table")
    got = ds.gather(np.arange(2000))
    values, offsets = got["blob"]
    assert [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(2000)] == blobs
    np.testing.assert_array_equal(got["label"], np.arange(2000))

    # Tar shards, named by a brace pattern.
    for s in range(2):
        shard = io.BytesIO()
        with tarfile.open(fileobj=shard, mode="w") as tar:
            for k in range(30):
                for ext, data in (("jpg", bytes([s, k]) * (k + 1)), ("cls", str(k).encode())):
                    info = tarfile.TarInfo(f"s{s}_{k:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        client.put_object(Bucket="corpus", Key=f"shards/train-{s}.tar", Body=shard.getvalue())
    done = subprocess.run([zr, "convert", str(tmp_path / "shards"), "--webdataset", "s3://corpus/shards/train-{0..1}.tar"], capture_output=True, text=True, env=run_env)
    assert done.returncode == 0, done.stderr
    shards = zrecord.open(tmp_path / "shards")
    assert len(shards) == 60
    values, offsets = shards.gather([31])["jpg"]
    assert values[offsets[0] : offsets[1]].tobytes() == bytes([1, 1]) * 2

    # A missing object is named, and nothing is left behind.
    done = subprocess.run([zr, "convert", str(tmp_path / "none"), "--jsonl", "s3://corpus/text/missing.jsonl", "--tokenizer", str(tokenizer)], capture_output=True, text=True, env=run_env)
    assert done.returncode != 0 and "s3://corpus/text/missing.jsonl: no such object" in done.stderr, done.stderr
    assert not (tmp_path / "none").exists()

    # From Python, natively.
    os.environ.update(env)
    try:
        made = zrecord.tokenize_jsonl("s3://corpus/text/a.jsonl.gz", tokenizer, tmp_path / "py", eos="</s>")
    finally:
        for key in env:
            os.environ.pop(key, None)
    assert made["documents"] == 3000
    np.testing.assert_array_equal(made["stream"].document(1234), local.document(1234))
