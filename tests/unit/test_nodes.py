"""How a training run's controller tells a lost node (``recsys.train.nodes``)."""

from __future__ import annotations

import socket

import ray


def test_a_node_whose_raylet_does_not_answer_is_lost_before_ray_marks_it_dead(monkeypatch):
    """Of the nodes asked for, Ray lists three as alive; only the one whose raylet port accepts a
    connection is up (a killed node's raylet refuses at once, long before its missed heartbeats
    mark it dead); a node Ray lists without a port to probe counts as up, as Ray says."""
    from recsys.train.nodes import answering_node_ids

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
    nodes = [
        {"NodeID": "up", "Alive": True, "NodeManagerAddress": "127.0.0.1",
         "NodeManagerPort": listening.getsockname()[1]},
        {"NodeID": "gone", "Alive": True, "NodeManagerAddress": "127.0.0.1",
         "NodeManagerPort": closed.getsockname()[1]},
        {"NodeID": "dead", "Alive": False, "NodeManagerAddress": "127.0.0.1",
         "NodeManagerPort": listening.getsockname()[1]},
        {"NodeID": "other", "Alive": True, "NodeManagerAddress": "127.0.0.1",
         "NodeManagerPort": listening.getsockname()[1]},
        {"NodeID": "unprobed", "Alive": True},
    ]  # fmt: skip
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    try:
        assert answering_node_ids({"up", "gone", "dead", "unprobed"}) == {"up", "unprobed"}
    finally:
        listening.close()
        closed.close()
