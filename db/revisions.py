"""The revision names of a build. Revisions with the same engine sources build one binary, and
the store keeps one ``builds`` row per binary; each revision name it was registered under is a
``build_revisions`` row, so that every one of those revisions finds the binary's runs (a history
shows each revision, a bisection or a comparison names any of them)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from db.models import Build, BuildRevision
from db.rows import chunks


def name_build(session: Session, build_id: int, revision: str) -> None:
    """Record that ``revision`` builds the build ``build_id`` (once)."""
    known = session.scalar(select(BuildRevision.id).where(BuildRevision.build_id == build_id,
                                                          BuildRevision.revision == revision))
    if known is None:
        session.add(BuildRevision(build_id=build_id, revision=revision))
        session.flush()


def build_names(conn: Connection, build_ids: Iterable[int]
                ) -> tuple[dict[int, list[str]], dict[int, str]]:
    """build id -> every revision name it was registered under, the build row's own first
    (builds stored before the names were kept have that one only); and build id -> the hash
    of its sources' code (``harness.identity.code_hash``, kept in the row's ``extra``; the
    source hash for a build recorded without it)."""
    ids = sorted({int(i) for i in build_ids})
    names: dict[int, list[str]] = {}
    code: dict[int, str] = {}
    for batch in chunks(ids):
        for build_id, revision, source, extra in conn.execute(
                select(Build.id, Build.revision, Build.source_hash, Build.extra)
                .where(Build.id.in_(batch))):
            names[build_id] = [revision]
            code[build_id] = str((extra or {}).get("code_hash") or source)
        for build_id, revision in conn.execute(
                select(BuildRevision.build_id, BuildRevision.revision)
                .where(BuildRevision.build_id.in_(batch)).order_by(BuildRevision.id)):
            if revision not in names[build_id]:
                names[build_id].append(revision)
    return names, code


def builds_named(conn: Connection, names: Iterable[str]) -> dict[str, str]:
    """name -> the revision the row of the build it names carries (the name a comparison or
    an export finds its runs under), for each of ``names`` a build was registered under."""
    wanted = sorted(set(names))
    found: dict[str, str] = {}
    for batch in chunks(wanted):
        for name, canonical in conn.execute(
                select(BuildRevision.revision, Build.revision)
                .join(Build, Build.id == BuildRevision.build_id)
                .where(BuildRevision.revision.in_(batch)).order_by(BuildRevision.id)):
            found.setdefault(name, canonical)
    return found
