"""bench.verify's timing of a case's columns in turns (no GPU: the graph and its replay faked)."""

from bench import verify


class FakeGraph:
    def __init__(self, launches):
        self.cost = len(launches)  # seconds per replay before the drift


def test_columns_in_turns_share_a_clock_drift(monkeypatch):
    clock = {"replays": 0}

    def replay_seconds(graph, count):
        clock["replays"] += count
        return graph.cost * (1 + 0.01 * clock["replays"])  # the card slows down as it runs

    monkeypatch.setattr(verify, "capture_graph", FakeGraph)
    monkeypatch.setattr(verify, "replay_seconds", replay_seconds)
    same = [None, None]  # two launches per graph: each column's time is per launch
    t = verify.time_graphs({"first": same, "second": same, "third": same}, groups=15, group_seconds=0)
    # Timed one after another, the third column would take ~30% longer than the first; in turns
    # (each round starting one column later) their medians stay within a round's drift.
    assert max(t.values()) / min(t.values()) < 1.04
    assert set(t) == {"first", "second", "third"}
    assert abs(t["first"] - 1.0) < 0.5  # per launch: the graph's two launches share its time


def test_one_column_is_time_graph(monkeypatch):
    monkeypatch.setattr(verify, "capture_graph", FakeGraph)
    monkeypatch.setattr(verify, "replay_seconds", lambda graph, count: 2.0 * graph.cost)
    assert verify.time_graph([None, None, None, None], groups=3, group_seconds=0) == 2.0
