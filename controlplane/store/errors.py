"""What the daemon answers a request it refuses (every handler raises it; body.py makes it the answer)."""

from __future__ import annotations


class ApiError(Exception):
    """A request the daemon refuses: kind maps to the HTTP status, field names what is wrong."""

    STATUS = {"invalid": 400, "unauthorized": 401, "forbidden": 403, "not_found": 404, "timeout": 408, "exists": 409, "conflict": 409,
              "too_large": 413, "unprocessable": 422, "quota": 422, "no_placement": 422, "unavailable": 503}

    def __init__(self, kind: str, field: str | None, why: str):
        super().__init__(f"{field}: {why}" if field else why)
        self.kind, self.field, self.why = kind, field, why

    @property
    def status(self) -> int:
        return self.STATUS[self.kind]

    def to_json(self) -> dict:
        return {"error": self.kind, "field": self.field, "why": self.why}
