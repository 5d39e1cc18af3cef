"""A job's secret values in its API views: shown as nulls, and a null sent back keeps the value."""

from __future__ import annotations

from typing import Any, Callable

from controlplane.security.sealing import TOKEN
from controlplane.store.records import ApiError, JobRec


def keep_secrets(data: Any, old: JobRec, open_value: Callable[[str, Any], Any] = lambda var, v: v) -> Any:
    """An update's body whose task.secret_env gives null for a name: the job's current value (the
    API shows secrets as nulls, so a job read and sent back keeps them), opened by
    `open_value(name, value)` (sealed at rest: controlplane/security/sealing.py). The same for
    controller_token: null (or absent) keeps it while the controller's URL stays, "" removes it."""
    if isinstance(data, dict) and data.get("controller_token") is None and old.controller_token \
            and data.get("controller") == old.controller:
        data = {**data, "controller_token": open_value(TOKEN, old.controller_token)}
    old_task = old.task
    task = data.get("task") if isinstance(data, dict) else None
    secret = task.get("secret_env") if isinstance(task, dict) else None
    if not isinstance(secret, dict) or all(v is not None for v in secret.values()):
        return data
    current = old_task.get("secret_env", {})
    filled = {}
    for k, v in secret.items():
        if v is None and k not in current:
            raise ApiError("unprocessable", f"task.secret_env.{k}", "null keeps the current value, and the job has none")
        filled[k] = open_value(k, current[k]) if v is None else v
    return {**data, "task": {**task, "secret_env": filled}}


def redact_task(task: dict) -> dict:
    """A task template as the API shows it: secret values are nulls."""
    if "secret_env" not in task:
        return task
    return {**task, "secret_env": dict.fromkeys(task["secret_env"])}
