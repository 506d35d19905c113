from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pytest

from sharding.requests import Completion, RequestKey, SamplingSpec, make_request
from sharding.store import ResultStore, StoreInUse


def test_request_id_changes_with_every_input_that_matters():
    base = RequestKey("m", None, "prompt", SamplingSpec(temperature=0.7), seed=1, sample_index=0)
    variants = [
        RequestKey("m2", None, "prompt", SamplingSpec(temperature=0.7), 1, 0),
        RequestKey("m", "lora-a", "prompt", SamplingSpec(temperature=0.7), 1, 0),
        RequestKey("m", None, "prompt!", SamplingSpec(temperature=0.7), 1, 0),
        RequestKey("m", None, "prompt", SamplingSpec(temperature=0.8), 1, 0),
        RequestKey("m", None, "prompt", SamplingSpec(temperature=0.7), 2, 0),
        RequestKey("m", None, "prompt", SamplingSpec(temperature=0.7), 1, 1),
    ]
    ids = {v.request_id() for v in variants}
    assert (
        base.request_id() == RequestKey("m", None, "prompt", SamplingSpec(temperature=0.7), 1, 0).request_id()
    )
    assert base.request_id() not in ids and len(ids) == len(variants)


def test_request_ids_are_those_earlier_stores_hold():
    """Ids hash the key's full JSON form (dataclasses.asdict), so stores written by earlier versions resume."""
    keys = [
        RequestKey("m", None, "p", SamplingSpec(), 1, 0),
        RequestKey(
            "m", "a:d", "", SamplingSpec(0.7, 0.9, 12, ("x", "\n"), (("top_k", 5),)), 3, 2, (1, 2), "chat"
        ),
        RequestKey("m", None, "é", SamplingSpec(), 0, 1, None, "loglikelihood", 2, ("extra",)),
    ]
    for key in keys:
        payload = json.dumps(asdict(key), sort_keys=True, ensure_ascii=False)
        assert key.request_id() == hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]
    assert keys[0].request_id() == "e4ae8173a73c9083527683089e1c0272"  # what every version so far computed


def test_store_round_trip_keeps_failures_and_survives_a_torn_write(tmp_path):
    path = tmp_path / "cache" / "completions.jsonl"
    store = ResultStore(path)
    store.add([Completion("a", text="A", output_tokens=3), Completion("b", error="boom")])
    store.add([Completion("e", error="every replica has died", retryable=True)])  # not a result: not kept
    store.add([Completion("a", text="again")])  # already stored: not written twice
    store.close()
    with path.open("a") as handle:
        handle.write('{"request_id": "c", "te')  # killed mid-write
    reopened = ResultStore(path)
    assert "a" in reopened and "b" in reopened and "c" not in reopened and "e" not in reopened
    assert reopened.get("a").text == "A"
    assert reopened.is_done("b", retry_failed=False) and not reopened.is_done("b", retry_failed=True)
    reopened.add([Completion("d", text="D"), Completion("b", text="B now")])
    reopened.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and all(line.endswith("}") for line in lines)
    final = ResultStore(path)
    assert len(final) == 3 and final.get("b").ok and final.get("b").text == "B now"


def test_a_second_writer_is_refused_until_the_first_closes(tmp_path):
    path = tmp_path / "completions.jsonl"
    first = ResultStore(path)
    with pytest.raises(StoreInUse):
        ResultStore(path)
    first.close()
    ResultStore(path).close()


def test_greedy_samples_are_one_request_whose_earlier_id_a_store_still_answers(tmp_path):
    """Temperature 0 gives one output whatever the seed: the N samples of a greedy question are one request.
    Its id ignores seed and sample index; a store written when they counted holds sample 0 under the id of
    the key with them, which the request keeps as its earlier id and the store answers."""
    greedy = [make_request("m", "p", SamplingSpec(), 1234 + i, i) for i in range(4)]
    assert len({r.request_id for r in greedy}) == 1
    assert greedy[0].request_id == RequestKey("m", None, "p", SamplingSpec(), 0, 0).request_id()
    written_then = RequestKey("m", None, "p", SamplingSpec(), 1234, 0).request_id()
    assert greedy[0].earlier_ids == (written_then,)
    sampled = [make_request("m", "p", SamplingSpec(temperature=0.5), 1234 + i, i) for i in range(4)]
    assert len({r.request_id for r in sampled}) == 4 and not any(r.earlier_ids for r in sampled)
    assert (
        sampled[1].request_id
        == RequestKey("m", None, "p", SamplingSpec(temperature=0.5), 1235, 1).request_id()
    )

    store = ResultStore(tmp_path / "completions.jsonl")
    store.add([Completion(written_then, text="the greedy answer", output_tokens=3)])
    store.close()
    store = ResultStore(tmp_path / "completions.jsonl")
    request = greedy[0]
    assert store.get(request.request_id) is None
    found = store.get(request.request_id, request.earlier_ids)
    assert (found.request_id, found.text, found.output_tokens) == (request.request_id, "the greedy answer", 3)
    assert store.is_done(request.request_id, retry_failed=True)
    store.close()


def test_the_store_knows_which_completions_this_run_added(tmp_path):
    path = tmp_path / "cache" / "completions.jsonl"
    first = ResultStore(path)
    first.add([Completion("a", text="A"), Completion("b", error="boom")])
    assert first.added_ids == {"a", "b"}
    first.close()
    resumed = ResultStore(path)  # a resumed run: what it reads back is not its own
    assert resumed.added_ids == set()
    resumed.add([Completion("a", text="again")])  # stored already: not added
    resumed.add([Completion("c", error="replica died", retryable=True)])  # not kept, not added
    resumed.add([Completion("b", text="B now"), Completion("d", text="D")])  # a retried failure and a new one
    assert resumed.added_ids == {"b", "d"}
    resumed.close()
