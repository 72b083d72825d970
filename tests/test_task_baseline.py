"""The per-task baseline's state is Postgres: the mean return of the latest consumed sessions of
each task_id on a model, read from real rows, so a restarted trainer continues with it."""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from migrations.runner import upgrade
from trainer.loop.task_baseline import task_means


def add_session(conn, sid: str, task: str, status: str, rewards: list[float], ago_s: int) -> None:
    conn.execute(
        text(
            "INSERT INTO sessions (id, status, train, task_id, consumed_at) VALUES "
            "(:id, :status, true, :task, now() - make_interval(secs => :ago))"
        ),
        {"id": sid, "status": status, "task": task, "ago": ago_s},
    )
    for value in rewards:
        conn.execute(
            text("INSERT INTO rewards (session_id, value, scope) VALUES (:s, :v, 'session')"),
            {"s": sid, "v": value},
        )


def consumed_by(conn, model_id: int, sid: str) -> None:
    conn.execute(
        text(
            "INSERT INTO consumption (model_id, version, session_id, used) VALUES (:m, 1, :s, true)"
        ),
        {"m": model_id, "s": sid},
    )


def test_task_means_average_the_latest_consumed_sessions_of_each_task_on_the_model(
    make_database,
):
    db_url = make_database()
    upgrade(db_url)
    engine = create_engine(db_url)
    with engine.begin() as conn:
        model, other = (
            conn.execute(
                text("INSERT INTO models (name) VALUES (:n) RETURNING id"), {"n": n}
            ).scalar_one()
            for n in ("m", "other")
        )
        # task "add": four consumed sessions; the oldest falls outside a window of 3
        for i, (rewards, ago) in enumerate(
            [([1.0], 10), ([0.0, 0.5], 20), ([0.25], 30), ([9.0], 99)]
        ):
            add_session(conn, f"add{i}", "add", "consumed", rewards, ago)
            consumed_by(conn, model, f"add{i}")
        add_session(conn, "add-open", "add", "closed", [5.0], 0)  # not consumed: not counted
        add_session(conn, "add-other", "add", "consumed", [7.0], 0)  # another model's
        consumed_by(conn, other, "add-other")
        add_session(conn, "mul0", "mul", "consumed", [0.5], 5)
        consumed_by(conn, model, "mul0")
        # rewards whose sum overflows float8 (an error in Postgres) are summed exactly
        add_session(conn, "huge0", "huge", "consumed", [1e308, 1e308, -1e308], 5)
        consumed_by(conn, model, "huge0")
        # an orphaned completion's reward does not count, as in training
        conn.execute(
            text(
                "INSERT INTO completions (id, session_id, api, model, status, stream, request, "
                "created_at, orphan_reason) VALUES ('c-orphan', 'mul0', 'chat.completions', 'm', "
                "'complete', false, '{}', now(), 'superseded by a retry')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO rewards (session_id, completion_id, value, scope) "
                "VALUES ('mul0', 'c-orphan', 100.0, 'completion')"
            )
        )
    with Session(engine) as db:
        assert task_means(db, model, ["add", "mul", "unseen"], window=3) == {
            "add": (1.0 + 0.5 + 0.25) / 3,
            "mul": 0.5,
        }
        assert task_means(db, model, ["huge"]) == {"huge": 1e308}
        assert task_means(db, model, ["add"], window=10)["add"] == (1.0 + 0.5 + 0.25 + 9.0) / 4
        assert task_means(db, model, []) == {}
    engine.dispose()
