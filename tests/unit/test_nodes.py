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


def test_a_trials_lost_process_is_one_line_and_its_own_error_keeps_its_traceback(caplog):
    """Tune's record of a trial whose process was lost (its node gone) becomes one line; a
    trial's own error stays as Tune logs it, with its traceback."""
    import logging

    from ray.exceptions import ActorUnavailableError, RayActorError

    from recsys.train.nodes import TUNE_CONTROLLER_LOGGER, quiet_lost_trial_processes

    quiet_lost_trial_processes()
    quiet_lost_trial_processes()  # (once, however often asked)
    log = logging.getLogger(TUNE_CONTROLLER_LOGGER)
    assert len(log.filters) == 1
    lost = ActorUnavailableError("RpcError: Socket closed", None)
    with caplog.at_level(logging.ERROR, logger=TUNE_CONTROLLER_LOGGER):
        log.error("Trial task failed for trial t_00000", exc_info=lost)
        log.error("Trial task failed for trial t_00001", exc_info=ValueError("a bad row"))
    first, second = caplog.records
    assert first.getMessage() == (
        "Trial task failed for trial t_00000: its process was lost (ActorUnavailableError: The "
        "actor None is unavailable: RpcError: Socket closed. The task may or may not have been "
        "executed on the actor.); Tune tries it again from its last checkpoint while "
        "--max-failures allows"
    )
    assert first.exc_info is None and "Traceback" not in caplog.text.split("t_00001")[0]
    assert second.exc_info is not None and second.getMessage().endswith("t_00001")
    # an actor that failed in its creation, and Tune's other records, keep their tracebacks
    failed_init = RayActorError(None, "its __init__ raised", actor_init_failed=True)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger=TUNE_CONTROLLER_LOGGER):
        log.error("Trial task failed for trial t_00002", exc_info=failed_init)
        log.error("Error stopping trial t_00003", exc_info=lost)
    assert [r.exc_info is not None for r in caplog.records] == [True, True]
    assert [r.getMessage() for r in caplog.records] == [
        "Trial task failed for trial t_00002",
        "Error stopping trial t_00003",
    ]


def test_an_actors_death_in_a_line_keeps_what_ray_says_last():
    from recsys.train.nodes import what_happened

    died = RuntimeError("The actor died unexpectedly before finishing this task.\n\tpid: 7\n"
                        "\tThe actor is dead because its node has died. Node Id: 3e53")  # fmt: skip
    assert what_happened(died) == (
        "The actor died unexpectedly before finishing this task. ... The actor is dead because "
        "its node has died. Node Id: 3e53"
    )
    assert what_happened(RuntimeError("one line")) == "one line"
