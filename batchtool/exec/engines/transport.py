"""How an engine whose workers are other processes ships work: functions, items and results as pickles whose Arrow
data travels as IPC messages (compacted, out of band), and errors that survive the trip with their type and message.

The Ray engine and the process engine share it; cloudpickle (a core dependency: Ray's own copy would import all of Ray
in every worker process) ships closures too.
"""

from __future__ import annotations

import io
import pickle
import traceback
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

import cloudpickle


class RemoteTraceback(Exception):
    """The worker-side traceback of an error raised in a task, chained as the re-raised error's cause."""

    def __str__(self) -> str:
        return self.args[0]


def portable(exc: Exception) -> tuple[type, tuple, dict, str]:
    """An exception as (type, args, attributes, traceback text): rebuilt on the driver without calling
    __init__, so errors whose constructor takes other arguments than their message survive."""
    state = (type(exc), exc.args, dict(exc.__dict__), "".join(traceback.format_exception(exc)))
    try:
        pickle.dumps(state)
    except Exception:  # an attribute that does not pickle: keep the message
        state = (RuntimeError, (f"{type(exc).__name__}: {exc}",), {}, state[3])
    return state


def rebuild(state: tuple[type, tuple, dict, str], where: str) -> Exception:
    """An exception portable() made, re-raised on the driver with the worker's traceback as its cause."""
    cls, args, attributes, remote = state
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(attributes)
    exc.__cause__ = RemoteTraceback(f"\n(in {where})\n{remote}")
    return exc


def _batch_from_ipc(schema: pa.Schema, message: pa.Buffer) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(message, schema)


def _array_from_ipc(schema: pa.Schema, message: pa.Buffer) -> pa.Array:
    return pa.ipc.read_record_batch(message, schema).column(0)


def _schema_from_ipc(message: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(message))


def _type_from_ipc(message: bytes, whole_field: bool) -> pa.Field | pa.DataType:
    field = _schema_from_ipc(message).field(0)
    return field if whole_field else field.type


def _plainly(obj: Any) -> Any:
    return NotImplemented


class _Pickler(cloudpickle.CloudPickler):
    """Pickles Arrow record batches and arrays as IPC messages: only the rows they show travel.

    Schemas, fields and types travel as IPC schemas too: pyarrow's own pickling names every
    fixed_size_list child "item", so a Parquet file written from a pickled schema would record
    other names (other bytes) than the local engine's.

    Plain pickling of a slice (a batch cut from a larger chunk, as bucket's and shuffle's
    batches are) ships the whole parent's list values; 64 such 32-row slices of one 5,000-row
    row group pickle to 3 GB instead of 20 MB. The IPC buffer then travels out of band
    (zero-copy through the object store).
    """

    def reducer_override(self, obj: Any) -> Any:
        try:
            if isinstance(obj, pa.Schema):
                return _schema_from_ipc, (obj.serialize().to_pybytes(),)  # in band: metadata, not data
            if isinstance(obj, (pa.Field, pa.DataType)):
                field = obj if isinstance(obj, pa.Field) else pa.field("a", obj)
                return _type_from_ipc, (pa.schema([field]).serialize().to_pybytes(), isinstance(obj, pa.Field))
            if type(obj) is pa.RecordBatch:
                return _batch_from_ipc, (obj.schema, obj.serialize())
            if isinstance(obj, pa.Array):
                batch = pa.RecordBatch.from_arrays([obj], ["a"])
                return _array_from_ipc, (batch.schema, batch.serialize())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # e.g. dictionary arrays: pickle them plainly
            pass
        return getattr(super(), "reducer_override", _plainly)(obj)


@dataclass
class Packed:
    """A pickled object and its out-of-band buffers, which Ray moves without copying them into the pickle."""

    payload: bytes
    buffers: list[pa.Buffer]

    @property
    def nbytes(self) -> int:
        return len(self.payload) + sum(b.size for b in self.buffers)


def pack(obj: Any) -> Packed:
    out, buffers = io.BytesIO(), []
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(obj)
    return Packed(out.getvalue(), [pa.py_buffer(b) for b in buffers])


def unpack(packed: Packed) -> Any:
    return pickle.loads(packed.payload, buffers=packed.buffers)


__all__ = ["Packed", "RemoteTraceback", "pack", "portable", "rebuild", "unpack"]
