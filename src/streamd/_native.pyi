# The compiled indexing core (native/src/python.rs), as type checkers see it.
# Kept by hand beside python.rs: a change there that bumps INTERFACE changes
# this file too.
from collections.abc import Callable, Sequence
from typing import Any, Final, TypedDict, TypeVar, final

import numpy as np

_M = TypeVar("_M")

INTERFACE: Final[int]
REBUILD_INTERFACE: Final[int]
ENTRY_INTERFACE: Final[int]
INODE_INTERFACE: Final[int]
CHECKSUM_INTERFACE: Final[int]
UNICODE_VERSION: Final[str]
MAX_LINE_BYTES: Final[int]
HOLD_LIMIT: Final[int]
MAX_DEPTH: Final[int]

class NativeError(RuntimeError):
    """The compiled indexing core failed (a bug: please report it)."""

@final
class SealedArray:
    """One array of a sealed segment: read-only little-endian bytes, lent
    through the buffer protocol (``numpy.frombuffer``) without a copy."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class _Sealed(TypedDict):
    # The segment's arrays as little-endian bytes, in the plain Segment's dtypes.
    count: int
    term_hash: SealedArray
    term_local: SealedArray
    starts: SealedArray
    recs: SealedArray
    meta: SealedArray
    big_pos: SealedArray
    big_count: SealedArray
    ident_hash: SealedArray
    ident_rec: SealedArray
    columns: SealedArray
    ids: SealedArray
    kinds: list[str]

_EventRow = tuple[int, str, str, str, str, str, str, str, int, str, str | None]

@final
class EventPage:
    """Event-log rows read into one buffer (``read_event_page``)."""

    def __len__(self) -> int: ...
    def __getitem__(self, i: int, /) -> _EventRow: ...

def read_event_page(db: int, sql: str, from_seq: int, limit: int) -> EventPage | None: ...
def encode_entry(row: tuple[Any, ...], /) -> bytes | None: ...
def sqlite_extension_loaded() -> bool: ...
def devices_and_inodes(paths: list[bytes], /) -> list[tuple[int, int] | int | None]: ...
def crc32(data: memoryview | bytes, value: int = 0) -> int: ...
def file_crc32(fd: int, spans: list[tuple[int, int]]) -> list[int]: ...

class _Record(TypedDict):
    schema: int
    id: str
    kind: str
    event_time: int
    observed_at: int | None
    system: str
    ref: str
    correlation: str
    title: str
    text: str
    actor: str
    revision: str

@final
class ChunkBuilder:
    """Records of one segment in the making: ``feed`` it chunks of lines, then ``seal``."""

    def __init__(self, base: int) -> None: ...
    @property
    def count(self) -> int: ...
    def feed(
        self,
        data: bytes,
        start: int,
        offset: int,
        max_records: int,
        max_lines: int,
        file_no: int,
        built_at: int,
    ) -> tuple[int, int, int, int, int | None]: ...
    def feed_events(
        self,
        rows: list[_EventRow] | EventPage,
        start: int,
        max_records: int,
        built_at: int,
    ) -> tuple[int, int, int, int | None, bool]: ...
    def seal(self) -> _Sealed: ...

def project_event(
    row: tuple[int, str, str, str, str, str, str, str, int, str, str | None],
) -> tuple[str, str, str, bytes] | None: ...
def parse_record(line: bytes) -> _Record | None: ...
def trim_space(line: bytes) -> bytes: ...
def tokenize(s: str) -> list[str]: ...
def fold(s: str) -> str: ...
def term_hash(term: str) -> int: ...
def rank_search(
    n: int,
    terms: Sequence[tuple[float, Sequence[Sequence[tuple[np.ndarray, np.ndarray]]]]],
    order: Sequence[int],
    positions: int,
    exact: np.ndarray,
    browse: bool,
    weights: tuple[float, float, float, float],
    columns: np.ndarray,
    layout: tuple[int, int, int, int],
    upper: tuple[int, int] | None,
    lower: tuple[int, int] | None,
    kinds: Sequence[bool] | None,
    removed: np.ndarray | None,
    ranks: Sequence[np.ndarray],
    block: int,
    sec_max: np.ndarray,
    covered: int,
    time_block: int,
    limit: int,
    stop: np.ndarray | None,
) -> tuple[list[int], list[float], list[bool], int, bool] | None: ...
def _panic_for_tests() -> None: ...

@final
class ModelPlan:
    """A pydantic model class's rebuild plan, compiled (``streamd/adk/convert.py``)."""

    def __init__(
        self,
        cls: type,
        template: dict[str, Any],
        fields: list[tuple[str, tuple[Any, ...], bool]],
        factories: list[tuple[str, Callable[[], Any]]],
        required: list[str],
        after: list[Callable[[Any], Any]],
        post_init: bool,
        no: object,
    ) -> None: ...
    def build(self, data: object) -> Any | None: ...
    def build_all(self, datas: list[Any]) -> list[Any | None]: ...

def copy_models(models: list[_M]) -> list[_M]: ...
