"""Vectors for BlazeDB documents and `query.nearest`, without making numpy a dependency.

    from array import array
    from blazedb.vectors import vector, floats
    client.doc.put(db="photos", collection="p", id="p1", doc={"embedding": vector(embedding)})
    hits = client.query.nearest(db="photos", collection="p", field="embedding", vector=embedding, k=10)
    array_of_floats = floats(hits["results"][0]["doc"]["embedding"])

`vector` accepts a list of numbers, an `array('f')` (or `'d'`), a numpy array of any float dtype, or anything
iterable of numbers, and returns `{"$vector": base64}` (little-endian float32), the value a document holds. The
client also sends those types as they are wherever a request holds them (a `query.nearest` vector, a document
field), as base64 for float32 buffers and as lists of numbers otherwise.
"""

import array
import base64
import sys
from typing import Any, Dict

MARKER = "$vector"


def _float32_bytes(values: Any) -> bytes:
    """Little-endian float32 bytes of `values`."""
    dtype = getattr(values, "dtype", None)
    if dtype is not None and hasattr(values, "astype") and hasattr(values, "tobytes"):
        # numpy (or alike): one conversion, no element loop.
        data: bytes = values.astype("<f4").tobytes()
        return data
    if isinstance(values, array.array) and values.typecode == "f":
        out = array.array("f", values)
    else:
        out = array.array("f", (float(x) for x in values))
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def encode(values: Any) -> str:
    """Base64 of the little-endian float32 form of `values` (what a `$vector` holds)."""
    return base64.b64encode(_float32_bytes(values)).decode("ascii")


def vector(values: Any) -> Dict[str, str]:
    """The document value of a vector: `{"$vector": base64 of little-endian float32}`."""
    return {MARKER: encode(values)}


def floats(value: Any) -> "array.array[float]":
    """The components of a vector value as read (`{"$vector": base64}` or `{"$vector": [numbers]}`, or the inner
    text or list) as an `array('f')`."""
    if isinstance(value, dict):
        value = value[MARKER]
    if isinstance(value, str):
        out = array.array("f")
        out.frombytes(base64.b64decode(value, validate=True))
        if sys.byteorder == "big":
            out.byteswap()
        return out
    return array.array("f", (float(x) for x in value))


def json_default(obj: Any) -> Any:
    """`json.dumps`'s `default`: float32 buffers as base64 text, other arrays and numpy values as lists and numbers."""
    if isinstance(obj, array.array):
        return encode(obj) if obj.typecode == "f" else list(obj)
    dtype = getattr(obj, "dtype", None)
    if dtype is not None and hasattr(obj, "tolist"):
        if getattr(obj, "ndim", 0) == 1 and str(dtype) == "float32":
            return encode(obj)
        return obj.tolist()
    if isinstance(obj, memoryview):
        return obj.tolist()
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")
