"""The lock file in a board's workdir: one benchmark command at a time, whoever sends it, and
who holds it.

Board leases in the result store keep coordinators that share a store apart; coordinators with
different stores (two people, two databases) meet only on the board. Each run's remote command
runs under ``LOCK_SCRIPT``: it takes ``flock`` on ``.benchfarm-lock`` in the workdir, writes its
holder into the file (coordinator, store, job, run, its pid, its session and the session's
parent: sshd's session process, or the local runner) and ``exec``s the command, which keeps the
lock until it and everything it started have ended. A command that finds the lock taken does
not run: it prints the holder's record and exits ``LOCKED_EXIT``, and the caller waits and tries
again, naming who holds the board. When the recorded holder is gone (its process, or the
connection that started it: a coordinator killed outright) while what it left behind still
holds the lock, the newcomer kills what it left behind and takes the lock over.

The record is only a claim: anyone who can write the lock file can write any session into it
(``sid=`` a victim's login session). So nothing is killed on the record's word. The command
runs with the run's key and a fresh lock id in its environment (``BENCHFARM_RUN``,
``BENCHFARM_LOCK_ID``, recorded as ``run`` and ``lock_id``), which every process it starts
inherits; a take-over (and ``ABORT_SCRIPT``) signals only the processes it can prove are that
run's under this lock: in the recorded session, carrying both recorded values in their own
environment (``/proc/PID/environ``, which no other user can read or set), and holding this
lock file open (``/proc/PID/fd``: the processes that keep the lock held). A process's command
line cannot prove it (a run's children are qemu, the fingerprint script's tools), so it is
not what is checked. A record that names no such process (forged, or written by an older
benchfarm) is refused and reported with the holder (``REFUSED_MARK``): nothing is signalled,
and the board stays locked until whoever holds it lets go.

``ABORT_SCRIPT`` kills the processes of one run proven as above (its whole process tree: the
engine, qemu, the fingerprint script), TERM then KILL, when the lock is still held by that
run: the coordinator calls it on cancel, SIGTERM/Ctrl-C, a lost lease, and after a timeout.
Boards need ``flock`` (util-linux or busybox), ``tr`` and Linux's /proc.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from devices.errors import BoardLocked
from devices.transport import CommandResult

LOCK_FILE = ".benchfarm-lock"
LOCKED_EXIT = 75  # EX_TEMPFAIL: the lock is taken, nothing ran
HELD_MARK = "benchfarm-lock: held by"
FIELDS = ("coordinator", "store", "job", "run", "pid", "sid", "parent", "since", "lock_id")
REFUSED_MARK = "benchfarm-lock: not taken over:"
FIELD_CHARS = 300  # each recorded value is cut to this (board output is untrusted)

# Helpers of both scripts. stat_of PID sets st_state, st_ppid and st_sid (false when PID is
# gone); the command name, which may hold spaces, is cut off at the last ')'.
FUNCTIONS = (r"""
lock=.benchfarm-lock
stat_of() {
  line=
  { read -r line; } 2>/dev/null < "/proc/$1/stat" || return 1
  set -- ${line##*) }
  st_state=$1 st_ppid=$2 st_sid=$4
}
alive() { stat_of "$1" && [ "$st_state" != Z ]; }
recorded() {  # recorded KEY: sets v to the lock file's value of KEY (its first 4 KiB read)
  v=$(head -c 4096 "$lock" 2>/dev/null | sed -n "s/^$1=//p" | tail -n 1)
}
ours() {  # ours PID SID RUN LOCK_ID: PID is proven a process of that run under this lock
  stat_of "$1" && [ "$st_sid" = "$2" ] && [ "$st_state" != Z ] || return 1
  [ -n "$3" ] && [ -n "$4" ] || return 1
  env=$(tr '\0' '\n' 2>/dev/null < "/proc/$1/environ") || return 1
  case "
$env
" in *"
BENCHFARM_RUN=$3
"*) ;; *) return 1 ;; esac
  case "
$env
" in *"
BENCHFARM_LOCK_ID=$4
"*) ;; *) return 1 ;; esac
  for fd in "/proc/$1/fd/"*; do
    [ "$fd" -ef "$lock" ] && return 0
  done 2>/dev/null
  return 1
}
signal_run() {  # signal_run SIG SID RUN LOCK_ID: whether any proven process of it was left
  left=
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    ours "$p" "$2" "$3" "$4" || continue
    left=1
    kill -s "$1" "$p" 2>/dev/null
  done
  [ -n "$left" ]
}
kill_run() {  # kill_run SID RUN LOCK_ID: TERM its proven processes, KILL what is left after 2 s
  stat_of $$; [ "$1" -gt 1 ] 2>/dev/null && [ "$1" != "$st_sid" ] || return 0
  for sig in TERM KILL; do
    signal_run "$sig" "$1" "$2" "$3" || return 0
    n=0
    while [ $n -lt 20 ]; do
      sleep 0.1; n=$((n + 1))
      signal_run 0 "$1" "$2" "$3" || return 0
    done
  done
}
held() {  # the holder's record on stderr (and why it was not taken over), exit LOCKED_EXIT
  printf '%s\n' 'HELD_MARK' >&2; head -c 4096 "$lock" >&2
  [ -z "$1" ] || printf '\n%s %s\n' 'REFUSED_MARK' "$1" >&2
  exit LOCKED_EXIT
}
""".replace("HELD_MARK", HELD_MARK).replace("REFUSED_MARK", REFUSED_MARK)
             .replace("LOCKED_EXIT", str(LOCKED_EXIT)))

# $1..$6: coordinator, store, job, run, since, lock id; then the command.
LOCK_SCRIPT = FUNCTIONS + r"""
# a lock file that is not a regular file is refused at once: opening a FIFO would block until
# the run's deadline, every run
if [ -e "$lock" ] && [ ! -f "$lock" ]; then
  echo "the board's lock file $PWD/$lock is not a regular file (a FIFO?); remove it" >&2
  exit 1
fi
exec 9>>"$lock" || exit 1
if ! flock -n 9; then
  recorded pid; pid=$v; recorded parent; parent=$v; recorded sid; sid=$v
  recorded run; run=$v; recorded lock_id; lock_id=$v
  if [ -n "$sid" ] && ! { alive "$pid" && alive "$parent"; }; then
    # its holder is gone: what it left behind goes too, once proven to be that run's
    found=
    for p in /proc/[0-9]*; do
      ours "${p#/proc/}" "$sid" "$run" "$lock_id" && { found=1; break; }
    done
    [ -n "$found" ] || held "its record names session $sid, none of whose processes is \
proven to be run $run under this lock (its environment, its open lock file): a forged or \
stale record; nothing was killed"
    kill_run "$sid" "$run" "$lock_id"
    flock -w 5 9 || held "what is left of its run still holds the lock"
  else
    held
  fi
fi
stat_of $$; sid=$st_sid; stat_of "$sid"; parent=$st_ppid
{ printf 'coordinator=%s\nstore=%s\njob=%s\nrun=%s\npid=%s\nsid=%s\nparent=%s\nsince=%s\n' \
    "$1" "$2" "$3" "$4" $$ "$sid" "$parent" "$5"; printf 'lock_id=%s\n' "$6"; } > "$lock"
BENCHFARM_RUN=$4 BENCHFARM_LOCK_ID=$6
export BENCHFARM_RUN BENCHFARM_LOCK_ID
shift 6
exec "$@"
"""

# $1: the run. Kills the run's proven processes (see ``ours``) while the lock file names that
# run; prints "aborted" when something was killed.
ABORT_SCRIPT = FUNCTIONS + r"""
[ -f "$lock" ] || exit 0
exec 9>>"$lock" || exit 0
if flock -n 9; then exit 0; fi  # nobody holds it: the run has ended
recorded run; [ "$v" = "$1" ] || exit 0
recorded sid; sid=$v; recorded lock_id; lock_id=$v
signal_run 0 "$sid" "$1" "$lock_id" || exit 0
kill_run "$sid" "$1" "$lock_id"
echo aborted
"""


def _one_line(value: object) -> str:
    return " ".join(str(value).split())[:FIELD_CHARS]


@dataclass(frozen=True)
class LockHolder:
    """Who runs a command under a board's lock (written into the lock file)."""

    coordinator: str  # the coordinator's holder id (host:pid:nonce)
    store: str  # its result store (URL, password hidden)
    job: int | None
    run: str  # the run key (a warm-up: the run it warms up for)

    def args(self) -> list[str]:
        """The lock script's arguments: the holder, now (the caller's clock, UTC) and a fresh
        lock id (in the command's environment: what a take-over or an abort proves it by)."""
        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return [_one_line(v) for v in (self.coordinator, self.store, self.job or "-", self.run,
                                       since, secrets.token_hex(8))]


def locked(argv: list[str], holder: LockHolder) -> list[str]:
    """``argv`` run under the board's lock as ``holder``; it does not run if another command
    holds it (one whose holder is gone is killed and the lock taken over)."""
    return ["sh", "-c", LOCK_SCRIPT, "sh", *holder.args(), *argv]


def abort_argv(run: str) -> list[str]:
    """The host command that kills ``run``'s session on the board if it still holds the lock."""
    return ["sh", "-c", ABORT_SCRIPT, "sh", _one_line(run)]


def holder_record(text: str) -> dict[str, str]:
    """The fields of a lock file's text (unknown keys and over-long values dropped)."""
    record = {}
    for line in text.splitlines()[:len(FIELDS) * 2]:
        key, sep, value = line.partition("=")
        if sep and key in FIELDS:
            record[key] = value[:FIELD_CHARS]
    return record


def describe_holder(record: dict[str, str]) -> str:
    if not record.get("coordinator"):
        return "a command that recorded no holder (an older benchfarm, or a start cut short)"
    job = record.get("job", "-")
    return (f"coordinator {record['coordinator']} of store {record.get('store', '?')} "
            f"(job {job if job != '-' else 'none'}, run {record.get('run', '?')}, pid "
            f"{record.get('pid', '?')}) since {record.get('since', '?')}")


def check_locked(device: str, workdir: str, result: CommandResult) -> None:
    """Raise BoardLocked, naming the holder, when ``result`` is that of a command that found
    the lock taken."""
    if result.exit_code == LOCKED_EXIT and result.stderr.startswith(HELD_MARK + "\n"):
        text, _, refused = result.stderr[len(HELD_MARK) + 1:].partition(
            "\n" + REFUSED_MARK + " ")
        record = holder_record(text)
        why = f"; not taken over: {_one_line(refused)}" if refused else ""
        raise BoardLocked(device, f"its lock file {workdir}/{LOCK_FILE} is held by "
                                  f"{describe_holder(record)}{why}")
