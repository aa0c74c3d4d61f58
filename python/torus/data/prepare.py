"""Tokenize text files into a Torus token file (.tok) or a Megatron dataset.

    python3 -m torus.data.prepare corpus/ --tokenizer tokenizer.json \\
        --append-eos 0 --output data/train.tok
    python3 -m torus.data.prepare a.txt b.txt --tiktoken gpt2 \\
        --format megatron --output data/train          # train.bin + train.idx

Each input file is one document; a directory stands for every regular file
below it, in sorted order of the path relative to it (symbolic links to
directories are not followed). Token ids are stored as uint16 when the
vocabulary has at most 65536 entries, else as uint32 (.tok) or int32
(Megatron, which has no uint32). docs/data.md gives both formats byte by
byte; torus::run::TokenDataset (C++) reads them.

Outputs are written under a temporary name in the output's directory,
fsync'ed and renamed into place, so a reader never sees a partial file and
an existing map of the old file keeps its contents. A Megatron pair is
renamed .bin first, then .idx; a reader that opens the pair between the two
renames finds their sizes disagree and refuses it.

Needs numpy, and `tokenizers` (--tokenizer) or `tiktoken` (--tiktoken);
tqdm, when installed, draws a progress bar on stderr. The file runs as a
plain script too (python3 path/to/prepare.py), without the rest of torus.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
from typing import Callable, Iterable, List, Optional, Sequence

import numpy as np

TOK_MAGIC = b"TORUSTOK"
TOK_VERSION = 1
TOK_HEADER = struct.Struct("<8sIIQQQ")  # magic, version, dtype code, tokens, vocab, documents: 40 bytes
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
MEGATRON_UINT16, MEGATRON_INT32 = 8, 4  # Megatron-LM's DType codes


class PrepareError(Exception):
    """A bad input or option, reported as one line without a traceback."""


def token_dtype(vocab_size: int, megatron: bool) -> np.dtype:
    """uint16 when every id (< vocab_size) fits, else uint32 (.tok) or int32."""
    if vocab_size <= 0:
        raise PrepareError(f"vocabulary size must be positive, got {vocab_size}")
    if vocab_size <= 1 << 16:
        return np.dtype("<u2")
    if megatron:
        if vocab_size > 1 << 31:
            raise PrepareError(f"vocabulary of {vocab_size} does not fit Megatron's int32 ids")
        return np.dtype("<i4")
    if vocab_size > 1 << 32:
        raise PrepareError(f"vocabulary of {vocab_size} does not fit uint32 ids")
    return np.dtype("<u4")


def list_files(inputs: Sequence[str]) -> List[str]:
    """The files of `inputs` in order; a directory expands to its regular
    files, sorted by relative path."""
    files: List[str] = []
    for path in inputs:
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):  # does not follow directory links
                dirs.sort()
                for n in names:
                    full = os.path.join(root, n)
                    if os.path.isfile(full):
                        found.append((os.path.relpath(full, path), full))
            files.extend(full for _, full in sorted(found))
        else:
            raise PrepareError(f"input '{path}' does not exist")
    if not files:
        raise PrepareError("no input files")
    return files


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _TempFile:
    """A file written under a temporary name next to `final`, then fsync'ed
    and renamed onto it by commit(); discard() removes it."""

    def __init__(self, final: str):
        self.final = final
        d = os.path.dirname(os.path.abspath(final))
        fd, self.name = tempfile.mkstemp(prefix="." + os.path.basename(final) + ".", suffix=".tmp", dir=d)
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 -> what open() would give
        self.f = os.fdopen(fd, "w+b")

    def commit(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.name, self.final)
        _fsync_dir(self.final)

    def discard(self) -> None:
        if not self.f.closed:
            self.f.close()
        if os.path.exists(self.name):
            os.unlink(self.name)


class TokWriter:
    """Writes a .tok file: the tokens stream to a scratch file (the header
    and document offsets come first but are known only at the end), then
    header + offsets + tokens go to the output by _TempFile."""

    def __init__(self, path: str, vocab_size: int):
        self.path = path
        self.vocab_size = vocab_size
        self.dtype = token_dtype(vocab_size, megatron=False)
        self.offsets = [0]
        self._tokens = _TempFile(path + ".tokens")

    @property
    def num_tokens(self) -> int:
        return self.offsets[-1]

    def add_document(self, ids: Sequence[int]) -> None:
        a = np.asarray(ids, dtype=np.int64)
        _check_ids(a, self.vocab_size)
        self._tokens.f.write(a.astype(self.dtype).tobytes())
        self.offsets.append(self.offsets[-1] + int(a.size))

    def finish(self) -> None:
        out = _TempFile(self.path)
        try:
            docs = len(self.offsets) - 1
            out.f.write(TOK_HEADER.pack(TOK_MAGIC, TOK_VERSION, self.dtype.itemsize, self.num_tokens,
                                        self.vocab_size, docs))
            if docs > 0:
                out.f.write(np.asarray(self.offsets, dtype="<u8").tobytes())
            self._tokens.f.flush()
            self._tokens.f.seek(0)
            while True:
                chunk = self._tokens.f.read(1 << 24)
                if not chunk:
                    break
                out.f.write(chunk)
            out.commit()
        except BaseException:
            out.discard()
            raise
        finally:
            self._tokens.discard()

    def abort(self) -> None:
        self._tokens.discard()


class MegatronWriter:
    """Writes prefix.bin and prefix.idx in Megatron-LM's MMIDIDX layout: one
    sequence per document, pointers consecutive from 0."""

    def __init__(self, prefix: str, vocab_size: int):
        self.prefix = prefix
        self.vocab_size = vocab_size
        self.dtype = token_dtype(vocab_size, megatron=True)
        self.lengths: List[int] = []
        self._bin = _TempFile(prefix + ".bin")

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def add_document(self, ids: Sequence[int]) -> None:
        a = np.asarray(ids, dtype=np.int64)
        _check_ids(a, self.vocab_size)
        if a.size >= 1 << 31:
            raise PrepareError(f"a document of {a.size} tokens does not fit Megatron's int32 lengths")
        self._bin.f.write(a.astype(self.dtype).tobytes())
        self.lengths.append(int(a.size))

    def finish(self) -> None:
        idx = _TempFile(self.prefix + ".idx")
        try:
            n = len(self.lengths)
            code = MEGATRON_UINT16 if self.dtype.itemsize == 2 else MEGATRON_INT32
            lengths = np.asarray(self.lengths, dtype="<i4")
            pointers = np.zeros(n, dtype="<i8")
            if n > 1:
                np.cumsum(lengths[:-1].astype("<i8") * self.dtype.itemsize, out=pointers[1:])
            doc_index = np.arange(n + 1, dtype="<i8")  # document i is sequence i
            idx.f.write(MEGATRON_MAGIC + struct.pack("<QBQQ", MEGATRON_VERSION, code, n, n + 1))
            idx.f.write(lengths.tobytes() + pointers.tobytes() + doc_index.tobytes())
            self._bin.commit()
            idx.commit()
        except BaseException:
            idx.discard()
            self._bin.discard()
            raise

    def abort(self) -> None:
        self._bin.discard()


def _check_ids(a: np.ndarray, vocab_size: int) -> None:
    if a.size and (a.min() < 0 or a.max() >= vocab_size):
        raise PrepareError(f"token id {int(a.max())} outside the vocabulary of {vocab_size}")


def load_encoder(tokenizer: Optional[str], tiktoken_name: Optional[str]):
    """(encode_batch(texts) -> list of id lists, vocab_size)."""
    if tokenizer:
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise PrepareError("--tokenizer needs the 'tokenizers' package (pip install tokenizers)") from e
        try:
            tok = Tokenizer.from_file(tokenizer)
        except Exception as e:  # the package raises a plain Exception for a bad file
            raise PrepareError(f"cannot load tokenizer '{tokenizer}': {e}") from e

        def encode(texts: List[str]) -> List[List[int]]:
            return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

        return encode, tok.get_vocab_size(with_added_tokens=True)
    try:
        import tiktoken
    except ImportError as e:
        raise PrepareError("--tiktoken needs the 'tiktoken' package (pip install tiktoken)") from e
    try:
        enc = tiktoken.get_encoding(tiktoken_name)
    except Exception as e:  # unknown name, or the encoding's file cannot be downloaded
        raise PrepareError(
            f"tiktoken encoding '{tiktoken_name}' is not available ({type(e).__name__}: {e}); tiktoken downloads "
            "encodings on first use: run once where the network is reachable, or point TIKTOKEN_CACHE_DIR at a "
            "cache that holds it") from e

    def encode(texts: List[str]) -> List[List[int]]:
        return enc.encode_ordinary_batch(texts)

    return encode, enc.n_vocab


def _progress(total: int, enabled: bool):
    if enabled:
        try:
            from tqdm import tqdm
            return tqdm(total=total, unit="file", file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            pass

    class _Quiet:
        def update(self, n: int) -> None:
            pass

        def set_postfix_str(self, s: str) -> None:
            pass

        def close(self) -> None:
            pass

    return _Quiet()


def prepare(files: Sequence[str], output: str, encode: Callable[[List[str]], List[List[int]]], vocab_size: int,
            fmt: str = "tok", append_eos: Optional[int] = None, batch_files: int = 64, progress: bool = True,
            encoding: str = "utf-8") -> dict:
    """Tokenizes `files` (one document each) into `output`; returns a summary
    dict (output files, dtype, tokens, documents)."""
    if append_eos is not None and not 0 <= append_eos < vocab_size:
        raise PrepareError(f"--append-eos {append_eos} is outside the vocabulary of {vocab_size}")
    if fmt == "megatron":
        prefix = output[:-4] if output.endswith((".bin", ".idx")) else output
        writer = MegatronWriter(prefix, vocab_size)
        outputs = [prefix + ".bin", prefix + ".idx"]
    elif fmt == "tok":
        writer = TokWriter(output, vocab_size)
        outputs = [output]
    else:
        raise PrepareError(f"unknown format '{fmt}' (tok or megatron)")
    bar = _progress(len(files), progress)
    try:
        for start in range(0, len(files), batch_files):
            batch = files[start:start + batch_files]
            texts = []
            for path in batch:
                try:
                    with open(path, encoding=encoding) as f:
                        texts.append(f.read())
                except (OSError, UnicodeDecodeError) as e:
                    raise PrepareError(f"cannot read '{path}' as {encoding}: {e}") from e
            for ids in encode(texts):
                if append_eos is not None:
                    ids = list(ids) + [append_eos]
                writer.add_document(ids)
            bar.update(len(batch))
            bar.set_postfix_str(f"{writer.num_tokens} tokens")
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    return {"outputs": outputs, "dtype": writer.dtype.name, "tokens": writer.num_tokens, "documents": len(files),
            "vocab_size": vocab_size}


def main(argv: Optional[Iterable[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m torus.data.prepare",
        description="Tokenize text files (one document per file; directories recursively, sorted) into a Torus "
        ".tok file or a Megatron .bin/.idx pair. See docs/data.md.")
    p.add_argument("inputs", nargs="+", help="text files or directories")
    p.add_argument("-o", "--output", required=True,
                   help="the .tok file, or the Megatron prefix (writes PREFIX.bin and PREFIX.idx)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer", metavar="JSON", help="a Hugging Face tokenizers file (tokenizer.json)")
    src.add_argument("--tiktoken", metavar="NAME", help="a tiktoken encoding, e.g. gpt2, cl100k_base")
    p.add_argument("--format", choices=["tok", "megatron"], default="tok", help="output format (default: tok)")
    p.add_argument("--append-eos", type=int, metavar="ID", help="append this id to every document")
    p.add_argument("--encoding", default="utf-8", help="text encoding of the inputs (default: utf-8)")
    p.add_argument("--batch-files", type=int, default=64, help="files tokenized per batch (default: 64)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(None if argv is None else list(argv))
    try:
        files = list_files(args.inputs)
        encode, vocab = load_encoder(args.tokenizer, args.tiktoken)
        out = prepare(files, args.output, encode, vocab, fmt=args.format, append_eos=args.append_eos,
                      batch_files=max(1, args.batch_files), progress=not args.no_progress, encoding=args.encoding)
    except PrepareError as e:
        print(f"prepare: error: {e}", file=sys.stderr)
        return 2
    print(f"prepare: {out['documents']} documents, {out['tokens']} tokens ({out['dtype']}, vocab "
          f"{out['vocab_size']}) -> {', '.join(out['outputs'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
