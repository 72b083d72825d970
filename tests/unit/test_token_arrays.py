"""Token arrays round-trip exactly through their 4-bytes-a-value encoding."""

import numpy as np

from rlgw.db.token_arrays import pack_ids, pack_logprobs, unpack_ids, unpack_logprobs


def test_ids_round_trip_including_large_vocabularies():
    ids = [0, 1, 258, 151_645, 2**31 - 1]
    blob = pack_ids(ids)
    assert len(blob) == 4 * len(ids)
    assert unpack_ids(blob) == ids


def test_float32_logprobs_round_trip_bit_exact():
    values = np.float32([-0.2394243, -9999.0, -1e-7, 0.0]).tolist()
    assert unpack_logprobs(pack_logprobs(values)) == values


def test_empty_and_missing_blobs_decode_to_empty_lists():
    assert unpack_ids(None) == [] and unpack_ids(b"") == []
    assert unpack_logprobs(None) == []
