"""`SlotRows`: the host step's estimate sums, one row per occupied slot, equal dense sums."""

import numpy as np
import pytest

from a2ats_engine.cache.slot_rows import SlotRows


def dense_reference(adds, shape, d, with_keys):
    counts = np.zeros(shape, np.float64)
    sums = np.zeros((*shape, d * (2 if with_keys else 1)), np.float64)
    B, n_kv, _ = shape
    for slots, w, values, keys in adds:
        w = np.broadcast_to(np.asarray(w, np.float64), slots.shape)
        rows = values if keys is None else np.concatenate([values, keys], axis=-1)
        for b in range(B):
            for h in range(n_kv):
                np.add.at(counts[b, h], slots[b, h], w[b, h])
                np.add.at(sums[b, h], slots[b, h], w[b, h][:, None] * rows[b, h])
    return counts, sums


@pytest.mark.parametrize("with_keys", [False, True])  # centroid slot scores, mean ones
def test_rows_follow_dense_sums_through_moves_duplicates_and_growth(with_keys):
    """Many tokens a slot (a rebuild), then steps of a few moves with and without two tokens of
    one slot: the rows spread over every slot equal dense sums; rows are given only to slots that
    took a token (so far fewer than the slots), and growing past the first capacity keeps them."""
    rng = np.random.default_rng(0)
    B, n_kv, n_slots, d = 2, 3, 400, 8
    rows = SlotRows(B, n_kv, n_slots, d, with_keys)
    adds = []

    def add(slots, w):
        values = rng.standard_normal((*slots.shape, d)).astype(np.float32)
        keys = rng.standard_normal((*slots.shape, d)).astype(np.float32) if with_keys else None
        rows.add(slots, w, values, keys)
        adds.append((slots, w, values, keys))

    add(rng.integers(0, 60, (B, n_kv, 500)), 1.0)  # a rebuild: slots 0-59 only
    assert 16 < rows.rows_used <= 60  # grew past the first 16 rows; only occupied slots
    for step in range(30):
        m = 5
        slots = rng.choice(n_slots, (B, n_kv, m))  # new slots too
        if step % 3 == 0:
            slots[..., 1] = slots[..., 0]  # two moves into one slot
        add(slots, rng.choice([-1.0, 1.0], m))
    counts, sums = rows.dense()
    want_counts, want_sums = dense_reference(adds, (B, n_kv, n_slots), d, with_keys)
    np.testing.assert_allclose(counts, want_counts, atol=1e-4)
    np.testing.assert_allclose(sums, want_sums, atol=1e-4)
    view_counts, values, keys, slot_of = rows.view()
    assert view_counts.shape == (B, n_kv, rows.rows_used + 1) and values.shape[-1] == d
    assert not view_counts[..., -1].any() and not values[..., -1, :].any()  # one empty row
    assert (keys is not None) == with_keys
    probe = rng.integers(0, n_slots, (B, n_kv, 7))
    got = rows.lookup(probe)
    for b in range(B):
        for h in range(n_kv):
            known = rows.row_of[b, h, probe[b, h]] >= 0
            assert (slot_of[b, h, got[b, h][known]] == probe[b, h][known]).all()
            assert (got[b, h][~known] == 0).all()  # no row: index 0, masked by the caller
    assert rows.nbytes < counts.nbytes + sums.nbytes  # fewer rows than slots held


def test_new_slots_take_rows_in_first_seen_order_per_kv_head():
    """Each (batch, KV head) numbers its own new slots from its own count, in the order they
    first appear, a slot seen twice taking one row; heads with nothing new keep theirs."""
    rows = SlotRows(1, 3, 50, 4, False)
    rows.rows(np.array([[[7, 3], [9, 9], [1, 2]]]))
    got = rows.rows(np.array([[[3, 20, 11, 20], [9, 9, 9, 9], [5, 2, 5, 40]]]))
    assert got.tolist() == [[[1, 2, 3, 2], [0, 0, 0, 0], [2, 1, 2, 3]]]
    assert rows.used.tolist() == [[4, 1, 4]]
    assert rows.slot_of[0, 0, :4].tolist() == [7, 3, 20, 11]
    assert rows.slot_of[0, 2, :4].tolist() == [1, 2, 5, 40]
    big = rows.rows(np.arange(40).reshape(1, 1, 40).repeat(3, axis=1))  # past 16 rows: grows
    assert rows.counts.shape[-1] >= 41 and (big >= 0).all()
    assert rows.slot_of[0, 1, : rows.used[0, 1]].tolist()[:2] == [9, 0]


@pytest.mark.parametrize("edges", [None, (64, 512, 2048), (100,)])
def test_a_steps_slot_moves_are_every_token_that_changed_slot(edges):
    """`retrieval.slot_moves` against every position's far bucket before and after one appended
    token; computed once for a step's layers (the same tuple)."""
    from a2ats_engine.cache import attention as att
    from a2ats_engine.cache.retrieval import slot_moves

    window, sinks, k = 16, 4, 12
    for n in (21, 22, 200, 2100, 2101, 3000):

        def bucket(context, p):
            lay = att.layout(context, window, sinks, k)
            if not lay.n_sinks <= p < lay.window_start:
                return None
            return sum((context - 1) - p >= lo for lo in edges or ())

        want = []
        for p in range(n):
            was, now = bucket(n - 1, p), bucket(n, p)
            if was != now:
                want += [(p, b, w) for b, w in ((was, -1.0), (now, 1.0)) if b is not None]
        got = slot_moves(n, window, sinks, edges)
        assert sorted(got) == sorted(want)
        assert slot_moves(n, window, sinks, edges) is got  # every layer of the step shares it


def test_placed_positions_read_their_slots_row_through_moves_and_growth():
    """`place` records each added token's row at its position; `at` reads it back per (batch,
    KV head), a token placed again (a farther bucket) reads its new row, and placing past the
    held positions grows them without losing the earlier ones."""
    rows = SlotRows(1, 2, 50, 4, False)
    ones = np.ones((1, 2, 3, 4), np.float32)
    placed = rows.add(np.array([[[5, 7, 5], [1, 1, 2]]]), 1.0, ones, None)
    rows.place(np.array([10, 11, 12]), placed)
    assert rows.at(np.array([[[12, 10, 11], [12, 10, 11]]])).tolist() == [[[0, 0, 1], [1, 0, 0]]]
    moved = rows.add(np.array([[[9], [2]]]), 1.0, ones[:, :, :1], None)  # position 11 moves
    rows.place(np.array([11]), moved)
    rows.place(np.array([300]), rows.add(np.array([[[7], [40]]]), 1.0, ones[:, :, :1], None))
    assert rows.row_at.shape[-1] > 300
    got = rows.at(np.array([[[11, 300, 10], [11, 300, 10]]]))
    assert got.tolist() == [[[2, 1, 0], [1, 2, 0]]]
    assert (rows.slot_of[0, 0, got[0, 0]] == [9, 7, 5]).all()
    assert (rows.slot_of[0, 1, got[0, 1]] == [2, 40, 1]).all()


def test_moves_with_a_few_repeated_rows_add_in_rounds_like_dense_sums():
    """Every layer's moves at once: 80 tokens, one row taking three of them (the buffered adds'
    rounds: a row's k-th token in round k) and one taking two; the sums equal dense ones, and
    the same moves with every row distinct take the single buffered add."""
    rng = np.random.default_rng(3)
    rows = SlotRows(1, 2, 300, 4, True)
    base = rng.integers(0, 300, (1, 2, 200))
    adds = []

    def add(slots, w):
        values = rng.standard_normal((*slots.shape, 4)).astype(np.float32)
        keys = rng.standard_normal((*slots.shape, 4)).astype(np.float32)
        rows.add(slots, w, values, keys)
        adds.append((slots, w, values, keys))

    add(base, 1.0)  # a rebuild first (the sorted sums)
    moves = np.stack([rng.permutation(300)[:40] for _ in range(2)])[None]
    add(moves, rng.choice([-1.0, 1.0], 40))  # all distinct
    moves = moves.copy()
    moves[0, 0, 1] = moves[0, 0, 2] = moves[0, 0, 0]  # one row three tokens
    moves[0, 1, 5] = moves[0, 1, 9]  # another two
    add(moves, rng.choice([-1.0, 1.0], 40))
    counts, sums = rows.dense()
    want_counts, want_sums = dense_reference(adds, (1, 2, 300), 4, True)
    np.testing.assert_allclose(counts, want_counts, atol=1e-4)
    np.testing.assert_allclose(sums, want_sums, atol=1e-4)
