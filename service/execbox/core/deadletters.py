"""The operator's side of dead letters (execbox.core.poison): list, show, replay, drop (admin role)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import redis
from redis.exceptions import WatchError

from execbox.core.keys import LoopKeys
from execbox.core.poison import DeadLetter
from execbox.core.redis import redis_errors, text


class DeadLetters:
    """What the operator's CLI does with dead letters: list, show, replay, drop (admin role)."""

    def __init__(self, client: redis.Redis, keys: LoopKeys, loops: Sequence[str]) -> None:
        """`loops`: every loop whose dead letters are listed and counted (`execbox.keyschema.LOOPS`)."""
        self.redis, self.keys, self.loops = client, keys, tuple(loops)

    def list(self, loop: str | None = None, limit: int = 100) -> list[DeadLetter]:
        found: list[DeadLetter] = []
        for name in (loop,) if loop else self.loops:
            with redis_errors():
                entries: Any = self.redis.xrange(self.keys.dead_letters(name), count=limit)
            found += [DeadLetter.decode(text(i), fields) for i, fields in entries]
        return found[:limit]

    def get(self, loop: str, letter_id: str) -> DeadLetter | None:
        with redis_errors():
            entries: Any = self.redis.xrange(self.keys.dead_letters(loop), letter_id, letter_id)
        return DeadLetter.decode(text(entries[0][0]), entries[0][1]) if entries else None

    def counts(self) -> dict[str, int]:
        with redis_errors(), self.redis.pipeline(transaction=False) as pipe:
            for name in self.loops:
                pipe.xlen(self.keys.dead_letters(name))
            return dict(zip(self.loops, (int(n) for n in pipe.execute()), strict=True))

    def replay(self, loop: str, letter_id: str) -> bool:
        """Queue the letter for its loop to put back (handled afresh, with a new attempt count);
        taken off the dead letters in the same transaction, so two replays put it back once."""
        dead = self.keys.dead_letters(loop)
        with redis_errors(), self.redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(dead)  # type: ignore[no-untyped-call]
                    entries: Any = pipe.xrange(dead, letter_id, letter_id)
                    if not entries:
                        return False
                    letter = DeadLetter.decode(text(entries[0][0]), entries[0][1])
                    pipe.multi()
                    pipe.xdel(dead, letter_id)
                    pipe.rpush(self.keys.replays(loop), json.dumps(asdict(letter)))
                    pipe.execute()
                    return True
                except WatchError:
                    continue  # another letter arrived meanwhile: look again

    def drop(self, loop: str, letter_id: str) -> bool:
        with redis_errors():
            return bool(self.redis.xdel(self.keys.dead_letters(loop), letter_id))


__all__ = ["DeadLetters"]
