"""Raw deflate (RFC 1951) of small stored documents, by ISA-L: the one compressor of the
formats' own bytes, the ZIP members of zarr's ``zarr.json`` and the gzip stream of a
large manifest (:func:`ckptstore.records.gzip_document`).

ISA-L's level 1 is its best trade here: a manifest of 10,000 blobs (1.03 MB of JSON)
deflates in 0.75 ms to 143 KB, where zlib's fastest level takes 5.5 ms for 159 KB; a
zarr ``zarr.json`` of 300 bytes takes 174 (zlib's level 6: 172). The same bytes always
give the same output with the same ISA-L. Inflating is not here: readers inflate with
zlib, whose gzip header checks are the stricter (ISA-L accepts reserved flags).

Example::

    >>> import zlib
    >>> document = b'{"zarr_format":3,"node_type":"array"}' * 4
    >>> deflated = deflate_raw(document)
    >>> len(deflated) < len(document), zlib.decompress(deflated, -zlib.MAX_WBITS) == document
    (True, True)
"""

from __future__ import annotations

from isal import isal_zlib

__all__ = ["deflate_raw"]

LEVEL = 1


def deflate_raw(data: bytes) -> bytes:
    """``data`` as one raw deflate stream (no zlib or gzip header or trailer)."""
    compressor = isal_zlib.compressobj(LEVEL, isal_zlib.DEFLATED, -isal_zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()
