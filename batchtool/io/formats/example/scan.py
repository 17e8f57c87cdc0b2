"""The schema pass over TFRecord records: every record's feature names, kinds and value counts (not their values),
merged in file order into the Arrow schema the records are read with.

The wire format is walked with NumPy (formats/wire.py), many records at once; records written
some other way than protobuf writes them are parsed with protobuf instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np
import pyarrow as pa

from batchtool.core.errors import CorruptRecordError, InputError, SchemaError, where
from batchtool.io.formats import wire
from batchtool.io.formats.example.columns import check_kind
from batchtool.io.formats.example.messages import (KIND_FIELD, ONEOF_KINDS, BadFeature, Example, SequenceExample,
                                                check_records, check_steps, parse_feature, parse_records)
from batchtool.io.formats.example.ragged import SLICE
from batchtool.io.formats.wire import PAD

MAX_FEATURES = 10_000
"""Distinct feature names (columns) an input may have: each costs memory and time in every chunk
decoded, so a record of many tiny features must not turn its bytes into columns."""

_FIELD_KIND = {field: kind for kind, field in KIND_FIELD.items()}

Place = tuple[str | None, int]
"""(file, record index): where something was first seen, for error messages."""


@dataclass(frozen=True)
class _Occurrences:
    """What a run of records holds, Feature by Feature, without the values themselves.

    A Feature is a context feature or one step of a feature list; records are local indices.
    """

    names: list[str]
    record: np.ndarray  # per Feature
    name: np.ndarray  # per Feature: index into names
    step: np.ndarray  # per Feature: a feature-list step (else a context feature)
    kind: np.ndarray  # per Feature: oneof field number, 0 when no kind is set
    count: np.ndarray  # per Feature: values it holds
    list_record: np.ndarray  # per feature list (steps or not)
    list_name: np.ndarray
    not_utf8: frozenset[int]  # names with a bytes value that is not UTF-8
    sequence: bool  # some record has the feature_lists field


def _entries(buf: np.ndarray, owner: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """The map entries of Features/FeatureLists messages: (owner, key start, key end, value start, value end).

    Every entry must be exactly key then value, as protobuf writes them; else Unusual.
    """
    holder, entry_start, entry_end = wire.items(buf, starts, ends)
    _, key_start, key_end = wire.field_at(buf, entry_start, 0x0A)
    if (key_end >= entry_end).any():
        raise wire.Unusual
    _, value_start, value_end = wire.field_at(buf, key_end, 0x12)
    if (value_end != entry_end).any():
        raise wire.Unusual
    return owner[holder], key_start, key_end, value_start, value_end


def _strings(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.LargeBinaryArray:
    """The (disjoint) byte ranges of buf as a binary array in their order, gathered by Arrow: no per-byte indices.

    The ranges, sorted, and the gaps between them are the values of one array over buf; taking
    every other value is the gather.
    """
    order = np.argsort(starts, kind="stable")
    bounds = np.empty(2 * starts.size + 1, dtype=np.int64)
    bounds[0:-1:2], bounds[1::2] = starts[order], ends[order]
    bounds[-1] = bounds[-2] if starts.size else 0
    spans = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * starts.size,
                                             [None, pa.py_buffer(bounds), pa.py_buffer(buf)])
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return spans.take(pa.array(2 * rank))


def _terminators(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Varints in each range (packed int64 values): its bytes below 0x80, each of which ends one."""
    size = ends - starts
    longest = int(size.max(initial=0))
    if longest <= len(PAD):  # a few values each: look at their bytes directly
        counts = np.zeros(starts.size, dtype=np.int64)
        for j in range(longest):
            counts += (j < size) & (buf[starts + j] < 0x80)
        return counts
    packed = _strings(buf, starts, ends)
    _, offsets, data = packed.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int64)[:len(packed) + 1]
    data = np.frombuffer(data, dtype=np.uint8)[:offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    running = np.zeros(data.size + 1, dtype=np.int32 if data.size < 1 << 31 else np.int64)
    np.cumsum(data < 0x80, out=running[1:])
    return (running[offsets[1:]] - running[offsets[:-1]]).astype(np.int64)


def _not_utf8(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, names: np.ndarray) -> frozenset[int]:
    """The names among these bytes values' names that have a value that is not valid UTF-8 (SLICE values at a time)."""
    bad: set[int] = set()
    for at in range(0, starts.size, SLICE):
        values, part_names = _strings(buf, starts[at:at + SLICE], ends[at:at + SLICE]), names[at:at + SLICE]
        try:
            values.cast(pa.large_string())
            continue
        except pa.ArrowInvalid:
            pass
        for name in set(np.unique(part_names).tolist()) - bad:
            try:
                values.filter(pa.array(part_names == name)).cast(pa.large_string())
            except pa.ArrowInvalid:
                bad.add(name)
    return frozenset(bad)


def _kinds_and_counts(buf: np.ndarray, starts: np.ndarray,
                      ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """Each Feature's oneof field number (0: none) and value count, and (Feature, start, end) of its bytes values.

    Packed lists must be one field, as protobuf writes them; else Unusual. Many Features are
    walked SLICE at a time, so the temporaries stay small.
    """
    if starts.size > SLICE:
        parts = [(at, _kinds_and_counts(buf, starts[at:at + SLICE], ends[at:at + SLICE]))
                 for at in range(0, starts.size, SLICE)]
        texts = tuple(np.concatenate([part[2][i] + (at if i == 0 else 0) for at, part in parts]) for i in range(3))
        return (np.concatenate([part[0] for _, part in parts]), np.concatenate([part[1] for _, part in parts]),
                texts)
    kinds = np.zeros(starts.size, dtype=np.int64)
    counts = np.zeros(starts.size, dtype=np.int64)
    present = np.flatnonzero(ends > starts)
    tags, list_start, list_end = wire.field_at(buf, starts[present], None)
    code = (tags >> 3).astype(np.int64)
    if (list_end != ends[present]).any() or (code > 3).any():
        raise wire.Unusual  # a second field, or not a value list
    kinds[present] = code
    packed = np.flatnonzero((code >= 2) & (list_end > list_start))
    _, value_start, value_end = wire.field_at(buf, list_start[packed], 0x0A)
    if (value_end != list_end[packed]).any():
        raise wire.Unusual
    size = value_end - value_start
    floats = code[packed] == 2
    if (size[floats] % 4).any():
        raise wire.Unusual
    ints = np.flatnonzero(~floats & (size > 0))
    if (buf[value_end[ints] - 1] >= 0x80).any():
        raise wire.Unusual  # a varint runs past its list's end
    counts[present[packed[floats]]] = size[floats] // 4
    counts[present[packed[ints]]] = _terminators(buf, value_start[ints], value_end[ints])
    texts = present[code == 1]
    owner, text_start, text_end = wire.items(buf, list_start[code == 1], list_end[code == 1])
    counts[texts] = np.bincount(owner, minlength=texts.size)
    return kinds, counts, (texts[owner], text_start, text_end)


def _occurrences_fast(payloads: Sequence[bytes], kind: str) -> _Occurrences:
    """_Occurrences by walking the wire format with NumPy; wire.Unusual for anything but plain protobuf output."""
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    buf = np.frombuffer(b"".join(payloads) + PAD, dtype=np.uint8)
    ends = np.cumsum(lengths)
    top = wire.message_fields(buf, ends - lengths, ends)
    holders = [top.numbered(1), top.numbered(2) if kind != "example" else top.take(top.number < 0)]
    context, lists = (_entries(buf, h.owner, h.start, h.end) for h in holders)
    keys = _strings(buf, np.concatenate([context[1], lists[1]]), np.concatenate([context[2], lists[2]]))
    encoded = keys.dictionary_encode()
    try:
        names = encoded.dictionary.cast(pa.large_string()).to_pylist()
    except pa.ArrowInvalid:
        raise wire.Unusual from None  # a key that is not UTF-8: protobuf says what is wrong
    ids = encoded.indices.to_numpy().astype(np.int64)
    context_names, list_names = ids[:context[0].size], ids[context[0].size:]
    for records, name_ids in ((context[0], context_names), (lists[0], list_names)):
        pairs = records * len(names) + name_ids
        if np.unique(pairs).size != pairs.size:
            raise wire.Unusual  # a repeated map key: the last one wins, as protobuf decides
    step_owner, step_start, step_end = wire.items(buf, lists[3], lists[4])
    kinds, counts, (texts, text_start, text_end) = _kinds_and_counts(
        buf, np.concatenate([context[3], step_start]), np.concatenate([context[4], step_end]))
    name = np.concatenate([context_names, list_names[step_owner]])
    return _Occurrences(names, np.concatenate([context[0], lists[0][step_owner]]), name,
                        np.arange(name.size) >= context[0].size, kinds, counts, lists[0], list_names,
                        _not_utf8(buf, text_start, text_end, name[texts]), bool(holders[1].owner.size))


def _occurrences_parsed(payloads: Sequence[bytes], kind: str, path: str | None, first_record: int) -> _Occurrences:
    """_Occurrences by protobuf's parser, one Feature at a time: any valid encoding, and the exact error otherwise.

    The records are parsed as the full messages first, as TensorFlow's parser would: the views
    do not look inside what protobuf sets aside (a map entry with an unknown field), the full
    messages do, so a record TensorFlow rejects is rejected here too.
    """
    parse_records(payloads, path, first_record, Example if kind == "example" else SequenceExample)
    index: dict[str, int] = {}
    features: list[tuple[int, int, bool, bytes]] = []
    lists: list[tuple[int, int]] = []
    sequence = False
    views = parse_records(payloads, path, first_record)
    check_records(views, payloads, kind, path, first_record)
    for i, message in enumerate(views):
        features += [(i, index.setdefault(name, len(index)), False, raw)
                     for name, raw in message.context.feature.items()]
        if kind != "example" and message.HasField("feature_lists"):
            sequence = True
            for name, steps in message.feature_lists.feature_list.items():
                check_steps(steps, payloads[i], kind, path, first_record + i)
                lists.append((i, index.setdefault(name, len(index))))
                features += [(i, lists[-1][1], True, raw) for raw in steps.feature]
    names = list(index)
    kinds, counts, not_utf8 = [], [], set()
    for record, name, _, raw in features:
        try:
            feature = parse_feature(raw, 0)
        except BadFeature as bad:
            raise CorruptRecordError(f"{where(path, record=first_record + record, column=names[name])}: "
                                     f"{bad.message}") from None
        found = feature.WhichOneof("kind")
        values = getattr(feature, found).value if found else ()
        kinds.append(ONEOF_KINDS.index(_FIELD_KIND[found]) if found else 0)
        counts.append(len(values))
        if found == "bytes_list" and name not in not_utf8:
            try:
                for value in values:
                    value.decode("utf-8")
            except UnicodeDecodeError:
                not_utf8.add(name)

    def column(position: int, rows: list[tuple]) -> np.ndarray:
        return np.array([row[position] for row in rows], dtype=np.int64)

    return _Occurrences(names, column(0, features), column(1, features), column(2, features).astype(bool),
                        np.array(kinds, dtype=np.int64), np.array(counts, dtype=np.int64), column(0, lists),
                        column(1, lists), frozenset(not_utf8), sequence)


def _too_many(count: int, at: Place) -> InputError:
    """More distinct feature names than MAX_FEATURES, the last ones first seen at `at`."""
    return InputError(f"{where(at[0], record=at[1])}: {count:,} distinct feature names, more than the "
                      f"{MAX_FEATURES:,} columns batchtool reads")


def _kind_conflict(name: str, kind: str, at: Place, first_kind: str, first_at: Place) -> InputError:
    """A feature holding `kind` at `at` after holding `first_kind` from `first_at` on."""
    first = where(first_at[0], record=first_at[1])
    return InputError(f"{where(at[0], record=at[1], column=name)}: holds {KIND_FIELD[kind]}, but earlier values "
                      f"of this feature are {KIND_FIELD[first_kind]} (first at {first}); one column holds one type")


@dataclass(frozen=True)
class _FeatureSeen:
    """What the schema pass learned about one feature: enough to choose its column type."""

    in_list: bool
    first: Place
    kind: str | None
    kind_first: Place | None
    width: int | None
    """Values per Feature: None if it has no Feature, w if every one holds w, -1 if they differ."""
    utf8: bool

    def merge(self, later: _FeatureSeen, name: str) -> _FeatureSeen:
        """This feature seen in earlier records and then in `later` ones; an error where they contradict."""
        if later.in_list != self.in_list:
            role = ("a feature list has the name of a context feature" if later.in_list
                    else "a context feature has the name of a feature list")
            raise SchemaError(f"{where(later.first[0], record=later.first[1], column=name)}: {role} (first seen "
                              f"at {where(self.first[0], record=self.first[1])}); one column cannot hold both")
        if self.kind and later.kind and later.kind != self.kind:
            raise _kind_conflict(name, later.kind, later.kind_first, self.kind, self.kind_first)
        width = later.width if self.width is None else self.width if later.width in (None, self.width) else -1
        return _FeatureSeen(self.in_list, self.first, self.kind or later.kind, self.kind_first or later.kind_first,
                            width, self.utf8 and later.utf8)

    def arrow_type(self) -> pa.DataType:
        """The column type: see infer_schema."""
        leaf = {None: pa.int64(), "int64": pa.int64(), "float": pa.float32()}.get(
            self.kind, pa.string() if self.utf8 else pa.binary())
        if not self.in_list:
            return leaf if self.width == 1 else pa.list_(leaf)
        if self.width in (None, 1):
            return pa.list_(leaf)
        return pa.list_(pa.list_(leaf, self.width)) if self.width > 1 else pa.list_(pa.list_(leaf))


def _seen(o: _Occurrences, path: str | None, first_record: int) -> dict[str, _FeatureSeen]:
    """Each feature's _FeatureSeen over one run of records; an error where the records contradict each other.

    Per-name minima and maxima by scattering (no sorting): a run can hold millions of Features.
    """
    n, never = len(o.names), np.iinfo(np.int64).max
    first = np.full(n, never)
    np.minimum.at(first, o.name, o.record)
    np.minimum.at(first, o.list_name, o.list_record)
    if n > MAX_FEATURES:
        raise _too_many(n, (path, first_record + int(np.sort(first)[MAX_FEATURES])))
    first_list = np.full(n, never)
    np.minimum.at(first_list, o.list_name, o.list_record)
    in_context = np.zeros(n, dtype=bool)
    in_context[o.name[~o.step]] = True
    clash = np.flatnonzero(in_context & (first_list < never))
    if clash.size:
        i = min(clash.tolist(), key=lambda c: (first_list[c], o.names[c]))  # the first in the records
        raise SchemaError(f"{where(path, record=first_record + int(first_list[i]), column=o.names[i])}: a feature "
                          "list has the name of a context feature; one column cannot hold both")
    kind_first = np.full((n, len(ONEOF_KINDS)), never)
    np.minimum.at(kind_first, (o.name, o.kind), o.record)
    kind_first[:, 0] = never  # no kind set: no constraint
    smallest = np.full(n, never)
    np.minimum.at(smallest, o.name, o.count)
    largest = np.full(n, -1)
    np.maximum.at(largest, o.name, o.count)
    out: dict[str, _FeatureSeen] = {}
    conflicts = []
    for i, name in enumerate(o.names):
        held = np.flatnonzero(kind_first[i] < never)
        kind, kind_first_at = None, None
        if held.size:
            code = int(held[np.argmin(kind_first[i, held])])
            kind, kind_first_at = ONEOF_KINDS[code], (path, first_record + int(kind_first[i, code]))
            for other in held[held != code].tolist():
                at = (path, first_record + int(kind_first[i, other]))
                conflicts.append((at[1], name, _kind_conflict(name, ONEOF_KINDS[other], at, kind, kind_first_at)))
        width = None if largest[i] < 0 else int(largest[i]) if largest[i] == smallest[i] else -1
        out[name] = _FeatureSeen(bool(first_list[i] < never), (path, first_record + int(first[i])), kind,
                                 kind_first_at, width, i not in o.not_utf8)
    if conflicts:
        raise min(conflicts, key=lambda c: c[:2])[2]  # the first in the records
    return out


@dataclass(frozen=True)
class FeatureScan:
    """Feature names, kinds and value counts of every record read so far: what a TFRecord schema is built from.

    Built a chunk at a time (scan_records) and merged in file order, so a feature first seen
    in the last record counts as much as one in the first.
    """

    records: int = 0
    sequence: bool = False
    features: Mapping[str, _FeatureSeen] = dataclass_field(default_factory=dict)

    def merge(self, later: FeatureScan) -> FeatureScan:
        """This scan followed by a scan of later records."""
        features = dict(self.features)
        for name, seen in later.features.items():
            features[name] = features[name].merge(seen, name) if name in features else seen
        if len(features) > MAX_FEATURES:
            raise _too_many(len(features), min((s.first for n, s in later.features.items() if n not in self.features),
                                               key=lambda place: place[1]))
        return FeatureScan(self.records + later.records, self.sequence or later.sequence, features)

    def schema(self, kind: str = "auto", source: str | None = None) -> tuple[pa.Schema, str]:
        """The Arrow schema and record kind (see infer_schema); InputError if no record has any feature."""
        if kind == "auto":
            kind = "sequence_example" if self.sequence else "example"
        check_kind(kind)
        if not self.records:
            raise InputError(f"{where(source)}: no records to infer a schema from")
        names = sorted(self.features, key=lambda n: (self.features[n].in_list, n))
        if not names:
            raise InputError(f"{where(source)}: no features in {self.records:,} records, so there are no columns "
                             "to read (every record is an empty Example)")
        return pa.schema([pa.field(n, self.features[n].arrow_type()) for n in names]), kind


def scan_records(payloads: Sequence[bytes], kind: str = "auto", *, path: str | None = None,
                 first_record: int = 0) -> FeatureScan:
    """The FeatureScan of serialized records: their feature names, kinds and value counts, not their values.

    Walks the wire format with NumPy (wire.message_fields), many records at once; records written
    some other way than protobuf writes them are parsed with protobuf instead, which also
    names the record of a malformed one (CorruptRecordError).
    """
    if kind != "auto":
        check_kind(kind)
    try:
        occurrences = _occurrences_fast(payloads, kind)
    except wire.Unusual:
        occurrences = _occurrences_parsed(payloads, kind, path, first_record)
    return FeatureScan(len(payloads), occurrences.sequence, _seen(occurrences, path, first_record))


def infer_schema(payloads: Sequence[bytes], kind: str = "auto", *, path: str | None = None,
                 first_record: int = 0) -> tuple[pa.Schema, str]:
    """The Arrow schema of serialized records, and their kind, from every one of them.

    kind="auto": "sequence_example" if any record has the feature_lists field
    (field 2, which an Example never has), else "example". A SequenceExample
    without feature lists decodes the same either way. Columns: context
    features (sorted by name), then feature lists (sorted). A context feature
    with exactly one value wherever present is a scalar, else a list; a feature
    list is list<T> if every step has one value, list<fixed_size_list<T, D>> if
    every step has D > 1, else list<list<T>>. int64_list -> int64, float_list ->
    float32, bytes_list -> string if every value is UTF-8, else binary; a feature
    that never holds a value kind -> int64. A feature missing from a record is
    null there. Records that disagree on a feature's kind, or use one name for a
    context feature and a feature list, are an error naming the record.
    """
    return scan_records(payloads, kind, path=path, first_record=first_record).schema(kind, path)
