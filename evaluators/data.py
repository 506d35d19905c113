"""Dataset rows from a local file or folder, the Hugging Face hub, or data an installed package ships."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from evaluators.errors import DataError

log = logging.getLogger(__name__)

HUB_PREFIX = "hf://"
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


def package_data_file(package: str, relative: str) -> Path | None:
    """A data file shipped inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))).joinpath(*package.split(".")[1:], relative)
    return candidate if candidate.is_file() else None


def packaged_or_hub(package: str, relative: str, hub: str) -> str:
    """The source of a task's default data: the copy an installed package ships, else the hub id."""
    packaged = package_data_file(package, relative)
    return str(packaged) if packaged is not None else hub


def load_rows(source: str, task: str, required: tuple[str, ...], split: str = "test") -> list[dict[str, Any]]:
    """Rows of `source`: a local .jsonl/.json/.parquet file, a folder holding one, or `hf://org/name[:config]`."""
    check_source(source, task)
    if source.startswith(HUB_PREFIX):
        rows = _load_hub(source[len(HUB_PREFIX) :], task, split)
    else:
        rows = _load_local(_resolve_local(Path(source).expanduser(), task, split), task)
    _check_fields(rows, required, source, task)
    return rows


def check_source(source: str, task: str) -> None:
    """What can be told about a data source without reading it: an empty path, `hf://` without a dataset, a
    local path that is missing or a file whose extension is none of the formats read here."""
    if not source.strip():
        raise DataError(
            f"Task '{task}': the data path is empty. Give a .jsonl/.json/.parquet file or folder, or "
            "hf://org/name[:config]; leave data_path out to use the task's default data."
        )
    if source.startswith(HUB_PREFIX):
        if not source[len(HUB_PREFIX) :].partition(":")[0].strip("/"):
            raise DataError(
                f"Task '{task}': the data path {source} names no dataset. Write hf://org/name or "
                "hf://org/name:config, e.g. hf://openai/gsm8k:main."
            )
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(
            f"Task '{task}': the data path {path} does not exist. Give an existing .jsonl/.json/.parquet "
            f"file or folder, or 'hf://org/name' to load from the Hugging Face hub."
        )
    if path.is_file() and path.suffix not in LOCAL_SUFFIXES:
        raise DataError(f"Task '{task}': {_unreadable_format(path)}")


def _unreadable_format(path: Path) -> str:
    """What a file of an extension rayeval does not read seems to be, and how to make it readable."""
    with path.open("rb") as handle:
        compressed = handle.read(2) == GZIP_MAGIC
    if compressed or path.suffix == ".gz":
        return (
            f"{path} is gzip-compressed. Decompress it first (`gunzip -k {path}`) and pass the file inside."
        )
    kind = f"a {path.suffix} file" if path.suffix else "a file without an extension"
    return (
        f"{path} is {kind}; rayeval reads .jsonl (one JSON object per line), .json (an array of objects) and "
        ".parquet. Convert it (a CSV with pandas: pd.read_csv(path).to_json('data.jsonl', orient='records', "
        "lines=True)), or rename it to .jsonl if it already holds one JSON object per line."
    )


def _resolve_local(path: Path, task: str, split: str) -> Path:
    if path.is_file():
        return path
    files = sorted(p for p in path.iterdir() if p.suffix in LOCAL_SUFFIXES)
    preferred = [p for p in files if p.stem.startswith(split)]
    if preferred or files:
        return (preferred or files)[0]
    raise DataError(
        f"Task '{task}': the folder {path} holds no .jsonl, .json or .parquet file. "
        f"Point --data-path at the data file itself, or put a '{split}.jsonl' in that folder."
    )


def _load_local(path: Path, task: str) -> list[dict[str, Any]]:
    """Local files are read directly (pyarrow for Parquet): `datasets` would copy each into its cache and
    print a progress bar the first time, even for a dry run."""
    if path.suffix == ".parquet":
        return _non_empty(_read_parquet(path, task), path, task)
    text = _read_text(path, task)
    if path.suffix == ".jsonl":
        return _parse_jsonl(text, path, task)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # JSON Lines under a .json name
            return _parse_jsonl(text, path, task)
        raise DataError(
            f"Task '{task}': {path} is not valid JSON (line {exc.lineno}: {exc.msg}). Give a JSON array of "
            "records, or one JSON object per line."
        ) from exc
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise DataError(
            f"Task '{task}': {path} holds a JSON {type(data).__name__}, not an array of records. Give a JSON "
            "array with one object per row, or a .jsonl file with one object per line."
        )
    return _non_empty(data, path, task)


def _read_parquet(path: Path, task: str) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    except Exception as exc:  # noqa: BLE001 - pyarrow and the file system raise many types; one message
        raise DataError(
            f"Task '{task}': could not read {path} as Parquet ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}). Check that it is a complete Parquet "
            "file with one record per row, or give the data as .jsonl."
        ) from exc


def _read_text(path: Path, task: str) -> str:
    try:
        return read_utf8(path)
    except NotUtf8 as exc:
        raise DataError(f"Task '{task}': {path} is not UTF-8 text: {exc.problem}. {exc.fix}.") from None
    except OSError as exc:
        raise DataError(
            f"Task '{task}': could not read {path} ({exc.strerror or type(exc).__name__}). Check that the "
            "file is readable by you."
        ) from None


class NotUtf8(ValueError):
    """A text file in another encoding: what it looks like, and how to convert it."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}. {fix}")
        self.problem = problem
        self.fix = fix


GZIP_MAGIC = b"\x1f\x8b"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_UTF8_BOM = b"\xef\xbb\xbf"


def read_utf8(path: Path) -> str:
    """The text of a file that must be UTF-8; a UTF-8 byte-order mark (as Windows editors write) is dropped.

    Raises NotUtf8 naming the encoding it looks like (UTF-16, gzip) or the first byte that is not UTF-8.
    """
    data = path.read_bytes()
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    if data.startswith(_UTF16_BOMS):
        raise NotUtf8(
            "it is UTF-16 (it starts with a UTF-16 byte-order mark)",
            f"Save it as UTF-8, e.g. `iconv -f UTF-16 -t UTF-8 {path} > {path.stem}.utf8{path.suffix}`",
        )
    if data.startswith(GZIP_MAGIC):
        raise NotUtf8(
            "it is gzip-compressed", f"Decompress it first (`gunzip -k {path}`) and pass the result"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise NotUtf8(
            f"byte 0x{data[exc.start]:02x} on line {line}, column {column} is not UTF-8 (Latin-1 or "
            "Windows-1252 text, perhaps)",
            f"Save it as UTF-8, e.g. `iconv -f LATIN1 -t UTF-8 {path} > {path.stem}.utf8{path.suffix}`",
        ) from None


def _parse_jsonl(text: str, path: Path, task: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for line_no, line in enumerate(text.split("\n"), start=1):  # JSON strings may hold U+2028, not \n
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"Task '{task}': line {line_no} of {path} is not valid JSON ({exc.msg}, column {exc.colno}). "
                "Fix or delete that line; every line must be one JSON object."
            ) from exc
        if not isinstance(row, dict):
            raise DataError(
                f"Task '{task}': line {line_no} of {path} is a JSON {type(row).__name__}, not an object. "
                "Every line must be one JSON object with the task's fields."
            )
        rows.append(row)
    return _non_empty(rows, path, task)


def _non_empty(rows: list[dict[str, Any]], path: Path, task: str) -> list[dict[str, Any]]:
    if not rows:
        raise DataError(
            f"Task '{task}': {path} holds no rows. Point --data-path at a file with data (one JSON object per "
            "line in a .jsonl)."
        )
    return rows


def offline_if_hub_unreachable(timeout_s: float = 3.0) -> bool:
    """Switch Hugging Face libraries to offline mode when the hub cannot be reached; True when offline.

    Without this, every hub dataset that is not cached costs about 20 s of retries before it fails. In
    offline mode, cached datasets still load and missing ones fail at once with a clear error.
    """
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection(
            (endpoint.hostname or "huggingface.co", endpoint.port or 443), timeout_s
        ):
            return False
    except OSError:
        pass
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    for module, attribute in (
        ("huggingface_hub.constants", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_HUB_OFFLINE"),
    ):
        if module in sys.modules:  # imported before the probe: they read the variable at import
            setattr(sys.modules[module], attribute, True)
    log.warning("the Hugging Face hub is unreachable from this machine: datasets load from local caches only")
    return True


def _load_hub(name: str, task: str, split: str) -> list[dict[str, Any]]:
    repo, _, config = name.partition(":")
    offline_if_hub_unreachable()
    try:
        import datasets

        return list(datasets.load_dataset(repo, config or None, split=split))
    except Exception as exc:  # noqa: BLE001
        raise DataError(
            f"Task '{task}': could not load '{repo}' from the Hugging Face hub "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}). "
            "This machine may be offline: download the split once elsewhere and pass its local "
            f".jsonl or .parquet with --data-path {task}=PATH (or `data_path` in the task's config)."
        ) from exc


def _check_fields(rows: list[dict[str, Any]], required: tuple[str, ...], source: str, task: str) -> None:
    for index, row in enumerate(rows):
        missing = [f for f in required if f not in row or row[f] is None]
        if missing:
            raise DataError(
                f"Task '{task}': row {index + 1} of {source} lacks the field(s) {', '.join(missing)} "
                f"(it has: {', '.join(sorted(row)) or 'nothing'}). Every row needs {', '.join(required)}."
            )
