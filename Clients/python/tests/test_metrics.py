"""The daemon's metrics parse as Prometheus text (prometheus-client's own parser) and move with the work done."""
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import blazedb


@pytest.fixture
def client(daemon):
    with blazedb.Client(daemon.socket) as c:
        yield c


def families(client):
    text = client.call("daemon.metrics")["text"]
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams, family, name, **labels):
    for s in fams[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def test_metrics_parse_and_count_requests_and_group_commits(client):
    before = families(client)
    assert before["blazed_requests"].type == "counter"
    assert before["blazed_request_seconds"].type == "histogram"
    assert before["blazed_write_group_size"].type == "histogram"
    puts = sample(before, "blazed_requests", "blazed_requests_total", method="doc.put", outcome="ok") or 0
    for i in range(25):
        client.call("doc.put", {"db": "default", "collection": "m", "id": f"d{i}", "doc": {"i": i}})
    # A render is reused for a second.
    deadline = time.monotonic() + 30
    after = families(client)
    while sample(after, "blazed_requests", "blazed_requests_total", method="doc.put", outcome="ok") != puts + 25:
        assert time.monotonic() < deadline, "the metrics never counted the puts"
        time.sleep(0.1)
        after = families(client)
    assert sample(after, "blazed_requests", "blazed_requests_total", method="doc.put", outcome="ok") == puts + 25
    assert sample(after, "blazed_request_seconds", "blazed_request_seconds_count", method="doc.put") == puts + 25
    assert sample(after, "blazed_write_group_size", "blazed_write_group_size_sum") >= 25
    assert sample(after, "blazed_database_file_bytes", "blazed_database_file_bytes", db="default") > 0
    assert sample(after, "blazed_info", "blazed_info") == 1
