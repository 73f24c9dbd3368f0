"""A randomized workload against a faulty store, checked against a model of what may be read.

Used by ``slatepy torture URL`` (a soak against any store) and by the CI reliability tests
(bounded, several seeds). One thread drives a writer (``Db``), a snapshot reader
(``DbReader``), a compactor and the garbage collector through puts, deletes, atomic batches,
flushes, reads, iterators, snapshots, transactions, compactions, GC passes, crashes (the
writer dropped without a flush) and clean reopens, with the store injecting the four
outcomes of :mod:`slatepy.testing.faults`.

The model (:class:`Model`) knows, per key, the last acknowledged value and the values whose
fate is unknown (written but not acknowledged), and when each TTL'd value expires on the
workload's own clock (moved by ``tick``; the writer, readers and compactors all read it). A
``delete_range`` is a delete of every model key in its range. Merge keys (``merge``: operands
joined by a comma, :func:`concat`) are modelled apart, as the set of values they may hold: a
write whose fate is unknown adds its outcome to the set rather than replacing it. Invariants
checked:

* every read returns the last acknowledged value or one of the unknown ones (nothing lost,
  nothing invented);
* the batch keys always read the same batch (batches are atomic), in one scan;
* a reader never goes back in time (values carry an increasing counter);
* at the end, with faults off, a freshly opened writer and a fresh reader agree with the model.

Beyond the one database (RFCs 0017 and 0018):

* a checkpoint reads, whatever was written, compacted and collected since, the model as it
  was when the checkpoint was made (a frozen copy: the acknowledged values then, or one of the
  values whose fate was unknown then); deleting one, then collecting, loses nothing live; a
  deleted one is ``NotFound``, never wrong data;
* a clone (of the live database or of a checkpoint, under ``clone_root``; not of
  ``memory://``, which cannot be reopened by URL) reads that frozen model plus its own writes,
  before and after the source is compacted and collected, and its writes never reach the
  source;
* the WAL's change feed (``WalReader``) yields records in seq order (a seq's range deletes
  first, then its point writes by key) and in the order the writes were issued, every record
  is a write that was issued, of the kind issued (a put with the expiry it was written with, a
  merge with its operands, a range delete with its bounds), and every acknowledged put and
  awaited range delete after the feed's start is in it, unless (a put) a later write to its
  key may have shared its WAL SST (the feed holds net changes per SST) or the garbage
  collector took that part of the WAL (``WalHistoryGone``);
* every (re)open of the writer picks a compression codec at random, so SSTs of every codec
  coexist and are compacted together, and how much it keeps in memory once compacted
  (``memtable_retain_bytes``: nothing, a little, so that prunes cut it, or the default).

The package, by job: ``model`` (the model, constants, report), ``base`` (state, writer
lifecycle, writes, view checks), ``ops_data``, ``ops_views``, ``ops_maintenance`` (the
operations), ``runner`` (:class:`Torture`: the mix, the run, the verification).
"""

from slatepy.testing.torture.model import (
    BATCH_KEYS,
    CHECKPOINT_LIFETIMES,
    CODECS,
    KEYS,
    MAX_CHECKPOINTS,
    MAX_CLONES,
    MERGE_KEYS,
    OPEN_ATTEMPTS,
    PAD,
    POLICY,
    PROGRESS_INTERVAL,
    READS_DURING_BATCH,
    RETAINS,
    HeldCheckpoint,
    HeldClone,
    Model,
    Report,
    Violation,
    WriteLog,
    concat,
    counter_of,
    counter_or_operand,
    feed_values,
)
from slatepy.testing.torture.runner import Torture

__all__ = [
    "BATCH_KEYS",
    "CHECKPOINT_LIFETIMES",
    "CODECS",
    "KEYS",
    "MAX_CHECKPOINTS",
    "MAX_CLONES",
    "MERGE_KEYS",
    "OPEN_ATTEMPTS",
    "PAD",
    "POLICY",
    "PROGRESS_INTERVAL",
    "READS_DURING_BATCH",
    "RETAINS",
    "HeldCheckpoint",
    "HeldClone",
    "Model",
    "Report",
    "Torture",
    "Violation",
    "WriteLog",
    "concat",
    "counter_of",
    "counter_or_operand",
    "feed_values",
]
