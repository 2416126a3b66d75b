"""Pins: what a fork leaves in the store it borrows from, so that store's gc keeps the objects the fork reads.

A fork's borrowed version (manifest.py) names objects of another store. Before the fork commits it, it creates one
pin per borrowed version in that store, ``pins/<id>.json``: the fork's store (a path from the pinned store's root),
the version and every stored object the version reads. The pinned store's gc keeps the pinned versions and every
object a pin lists (gc.py says why this is safe while a fork is being made); the fork's gc removes the pin once it
has deleted the borrowed version, and the fork removes it itself when it fails before committing (fork.py). A pin is
never removed by the pinned store: one whose fork holds no version naming it (a fork that stopped mid-way, or whose
run folder was deleted by hand) is only reported, as ``unclaimed_pins`` of gc.
"""
from __future__ import annotations

import time
import uuid

from pydantic import BaseModel, ConfigDict, Field

from .errors import CheckpointError
from .manifest import Borrowed, Manifest, utc_now_iso
from .objects import StoreObjects, mtime

RELISTS = 20
"""Listings of pins/ gc tries before giving up when pins keep disappearing between its listing and its reads."""


class Pin(BaseModel):
    """One borrowed version of one fork, as its pin records it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fork: str = Field(min_length=1, description="path from the pinned store's root to the fork's store")
    version: int = Field(ge=0)
    objects: list[str] = Field(description="sha256 of every stored object the borrowed version reads")
    created: str = Field(default_factory=utc_now_iso)


def new_pin_id() -> str:
    return uuid.uuid4().hex


def create_pin(home: StoreObjects, pin_id: str, pin: Pin) -> None:
    """Create the pin exclusively (an id is never reused)."""
    home.create_exclusive(home.pin_path(pin_id), pin.model_dump_json().encode())


def release_pin(objects: StoreObjects, borrowed: Borrowed) -> None:
    """Remove the pin a borrowed version of the store ``objects`` holds (gone already: nothing to do)."""
    home = objects.at(borrowed.store)
    home.discard(home.pin_path(borrowed.pin))


def read_pins(objects: StoreObjects, url: str, grace_s: float) -> dict[str, Pin]:
    """Every pin on the store's objects, by id.

    Listed again whenever a listed pin is gone before it is read: a pin created before that removal may be missing
    from the stale listing, and gc's argument (gc.py) needs every pin that existed when the listing was taken or
    created before a pin's removal. A pin that does not parse is one being written (then its fork has not checked
    its version yet, so it protects nothing yet) unless it is older than ``grace_s``: then gc cannot tell what it
    keeps, and stops."""
    for _ in range(RELISTS):
        pins: dict[str, Pin] = {}
        for pin_id in objects.list_pins():
            path = objects.pin_path(pin_id)
            try:
                data = objects.read_fresh(path)
            except FileNotFoundError:
                break
            try:
                pins[pin_id] = Pin.model_validate_json(data)
            except ValueError:
                info = objects.info_or_none(path)
                t = None if info is None else mtime(info)
                if t is not None and time.time() - t <= grace_s:
                    continue
                raise CheckpointError(f"checkpoint store {url}: pin {path} is not readable ({data[:80]!r}), so gc "
                                      "cannot tell which objects a fork still reads; no object was deleted. Remove it "
                                      "only if no fork borrows from this store") from None
        else:
            return pins
    raise CheckpointError(f"checkpoint store {url}: pins kept disappearing while gc read them ({RELISTS} listings); "
                          "no object was deleted, run gc again")


def claimed_by_fork(objects: StoreObjects, pin_id: str, pin: Pin) -> bool:
    """Whether the pin's fork holds a version (committed or claimed) that names the pin."""
    fork = objects.at(pin.fork)
    try:
        manifest = Manifest.from_json_bytes(fork.read_fresh(fork.manifest_path(pin.version)))
    except FileNotFoundError:
        return False
    except ValueError:
        return True  # being written, or damaged: not ours to judge
    return manifest.borrowed is not None and manifest.borrowed.pin == pin_id


def pin_record(fork: StoreObjects, home: StoreObjects, version: int, manifest: Manifest) -> Pin:
    """The pin of ``fork`` borrowing ``version`` (``manifest``) from ``home``."""
    return Pin(fork=fork.relative_to(home), version=version, objects=sorted(manifest.stored_objects()))

