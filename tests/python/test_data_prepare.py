"""torus.data.prepare: text files -> .tok and Megatron .bin/.idx.

One process, no network. A tiny BPE tokenizer is trained here with the
`tokenizers` package on local text; the tool runs as a subprocess (as a plain
script, so the test needs neither torch nor the extension), and its outputs
are parsed by numpy in this file, following docs/data.md byte by byte
without the tool's code; the expected ids are the tokenizer's own encoding
of each file, in the tool's file order, plus the end-of-text id. The C++
reader is tested against the same layouts in tests/train/token_data_test.cpp.
"""
import importlib.util
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers package is not installed")

PREPARE = os.path.join(os.path.dirname(__file__), "..", "..", "python", "torus", "data", "prepare.py")

TEXTS = {
    "b/two.txt": "the quick brown fox jumps over the lazy dog\nand the dog sleeps\n",
    "a.txt": "hello world, hello tokens\n",
    "b/c/three.txt": "a third document about cats and dogs and foxes\n",
    "b/empty.txt": "",
}
ORDER = ["a.txt", "b/c/three.txt", "b/empty.txt", "b/two.txt"]  # sorted relative paths


def run(*args, check=True):
    p = subprocess.run([sys.executable, PREPARE, *args], capture_output=True, text=True)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def load_prepare():
    spec = importlib.util.spec_from_file_location("torus_data_prepare", PREPARE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for rel, text in TEXTS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(list(TEXTS.values()),
                            trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "<|endoftext|>"]))
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    tok.save(path)
    eos = tok.token_to_id("<|endoftext|>")
    docs = [tok.encode(TEXTS[rel], add_special_tokens=False).ids + [eos] for rel in ORDER]
    return {"root": str(root), "tokenizer": path, "eos": eos, "docs": docs, "vocab": tok.get_vocab_size()}


def read_tok(path):
    """The .tok layout: 40-byte header, u64 offsets[docs + 1] when docs > 0, tokens."""
    raw = open(path, "rb").read()
    magic, version, code, n, vocab, docs = struct.unpack_from("<8sIIQQQ", raw, 0)
    assert (magic, version) == (b"TORUSTOK", 1)
    assert code in (2, 4)
    offsets = np.frombuffer(raw, dtype="<u8", count=docs + 1, offset=40) if docs else np.zeros(0, "<u8")
    start = 40 + offsets.nbytes
    assert len(raw) == start + n * code
    tokens = np.frombuffer(raw, dtype="<u2" if code == 2 else "<u4", count=n, offset=start)
    return code, vocab, offsets, tokens


def read_megatron(prefix):
    """Megatron-LM's MMIDIDX index and the .bin it points into."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version, code, seqs, docs = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1
    lengths = np.frombuffer(idx, dtype="<i4", count=seqs, offset=34)
    pointers = np.frombuffer(idx, dtype="<i8", count=seqs, offset=34 + 4 * seqs)
    doc_index = np.frombuffer(idx, dtype="<i8", count=docs, offset=34 + 12 * seqs)
    assert len(idx) == 34 + 12 * seqs + 8 * docs
    dtype = {8: "<u2", 4: "<i4"}[code]
    tokens = np.fromfile(prefix + ".bin", dtype=dtype)
    return code, lengths, pointers, doc_index, tokens


def test_help():
    p = run("--help")
    assert "--tokenizer" in p.stdout and "--format" in p.stdout and "--append-eos" in p.stdout


def test_tok_file(corpus, tmp_path):
    out = str(tmp_path / "train.tok")
    p = run(corpus["root"], "--tokenizer", corpus["tokenizer"], "--append-eos", str(corpus["eos"]), "-o", out)
    code, vocab, offsets, tokens = read_tok(out)
    assert code == 2 and vocab == corpus["vocab"]  # a vocabulary of 120 is stored as uint16
    expected = np.concatenate([np.asarray(d, np.int64) for d in corpus["docs"]])
    np.testing.assert_array_equal(tokens.astype(np.int64), expected)
    np.testing.assert_array_equal(offsets, np.cumsum([0] + [len(d) for d in corpus["docs"]]))
    assert f"{len(expected)} tokens" in p.stderr
    assert sorted(os.listdir(tmp_path)) == ["train.tok"]  # no temporary file left


def test_megatron_pair(corpus, tmp_path):
    prefix = str(tmp_path / "train")
    run(corpus["root"], "--tokenizer", corpus["tokenizer"], "--append-eos", str(corpus["eos"]), "--format",
        "megatron", "-o", prefix + ".bin", "--no-progress")
    code, lengths, pointers, doc_index, tokens = read_megatron(prefix)
    assert code == 8
    np.testing.assert_array_equal(lengths, [len(d) for d in corpus["docs"]])
    np.testing.assert_array_equal(pointers, 2 * np.cumsum([0] + [len(d) for d in corpus["docs"]][:-1]))
    np.testing.assert_array_equal(doc_index, np.arange(len(corpus["docs"]) + 1))
    np.testing.assert_array_equal(tokens.astype(np.int64), np.concatenate(corpus["docs"]))
    assert sorted(os.listdir(tmp_path)) == ["train.bin", "train.idx"]


def test_files_in_given_order_without_eos(corpus, tmp_path):
    out = str(tmp_path / "two.tok")
    root = corpus["root"]
    run(os.path.join(root, "b", "two.txt"), os.path.join(root, "a.txt"), "--tokenizer", corpus["tokenizer"], "-o",
        out, "--no-progress")
    _, _, offsets, tokens = read_tok(out)
    first, second = corpus["docs"][3][:-1], corpus["docs"][0][:-1]
    np.testing.assert_array_equal(tokens.astype(np.int64), first + second)
    np.testing.assert_array_equal(offsets, [0, len(first), len(first) + len(second)])


def test_wide_vocabulary_dtypes(tmp_path):
    prep = load_prepare()
    docs = [[0, 70000, 5], [69999]]
    for fmt, path in (("tok", str(tmp_path / "w.tok")), ("megatron", str(tmp_path / "w"))):
        files = []
        for i, _ in enumerate(docs):
            f = tmp_path / f"d{i}.txt"
            f.write_text(str(i))
            files.append(str(f))
        prep.prepare(files, path, lambda texts: [docs[int(t)] for t in texts], 70001, fmt=fmt, progress=False)
    code, vocab, offsets, tokens = read_tok(str(tmp_path / "w.tok"))
    assert code == 4 and vocab == 70001
    np.testing.assert_array_equal(tokens, [0, 70000, 5, 69999])
    code, lengths, pointers, _, tokens = read_megatron(str(tmp_path / "w"))
    assert code == 4  # int32: Megatron has no uint32
    np.testing.assert_array_equal(pointers, [0, 12])
    np.testing.assert_array_equal(tokens, [0, 70000, 5, 69999])


def test_errors_leave_no_output(corpus, tmp_path):
    out = str(tmp_path / "bad.tok")
    p = run(str(tmp_path / "missing"), "--tokenizer", corpus["tokenizer"], "-o", out, check=False)
    assert p.returncode == 2 and "does not exist" in p.stderr
    p = run(corpus["root"], "--tokenizer", corpus["tokenizer"], "--append-eos", "100000", "-o", out, check=False)
    assert p.returncode == 2 and "outside the vocabulary" in p.stderr
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9\n")
    p = run(str(bad), "--tokenizer", corpus["tokenizer"], "-o", out, check=False)
    assert p.returncode == 2 and "latin1.txt" in p.stderr
    assert sorted(os.listdir(tmp_path)) == ["latin1.txt"]
    p = run(corpus["root"], "--tokenizer", str(tmp_path / "nope.json"), "-o", out, check=False)
    assert p.returncode == 2 and "cannot load tokenizer" in p.stderr


def test_tiktoken_available_or_clear_error(corpus, tmp_path):
    pytest.importorskip("tiktoken", reason="the tiktoken package is not installed")
    out = str(tmp_path / "tt.tok")
    p = run(corpus["root"], "--tiktoken", "gpt2", "-o", out, "--no-progress", check=False)
    if p.returncode == 0:  # the encoding is cached or downloadable here
        code, vocab, _, tokens = read_tok(out)
        assert code == 2 and vocab == 50257 and tokens.size > 0
    else:
        assert p.returncode == 2 and "tiktoken encoding 'gpt2' is not available" in p.stderr, p.stderr
        assert not os.path.exists(out)
