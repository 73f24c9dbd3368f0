"""The transactional store of the two-phase CAS: one DynamoDB item per destination.

Table schema (RFC 0004): partition key ``pk`` (S) = the database's store URL, sort key ``sk``
(S) = the destination path inside it; attributes ``source`` (S, the temporary object),
``committed`` (BOOL) and ``created`` (N, epoch seconds). One partition per database keeps
"records under a prefix after an offset" a strongly consistent ``Query`` on the key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from slatepy.config import Settings
from slatepy.errors import CorruptionError, InvalidArgument, NotFound, StoreUnavailable

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError as exc:  # an optional extra: only cas="dynamodb" needs it
    raise InvalidArgument(
        'cas="dynamodb" and the slatepy dynamodb commands need boto3: '
        'pip install "slatepy[dynamodb]"'
    ) from exc
from slatepy.store.metrics import StoreMetrics

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

# A sort key above every path: paths are ASCII, so this sorts after any of them.
_KEY_END = "\U0010ffff"


@dataclass(frozen=True, slots=True)
class Record:
    """The intent to copy ``source`` to ``destination`` (durable once it exists)."""

    destination: str
    source: str
    committed: bool
    created: float


class RecordExists(Exception):
    """Another record already claims the destination."""

    def __init__(self, existing: Record | None) -> None:
        super().__init__("destination already claimed")
        self.existing = existing


class DynamoRecords:
    """Two-phase records of one database (``namespace``) in one DynamoDB table.

    Every call is counted in ``metrics`` as ``dynamodb.<Operation>``. Errors: a missing table
    is ``NotFound``; network failures and throttling after botocore's retries are
    ``StoreUnavailable`` with ``definite=False`` for writes.
    """

    def __init__(
        self,
        client: DynamoDBClient,
        table: str,
        namespace: str,
        metrics: StoreMetrics | None = None,
    ) -> None:
        self._client = client
        self.table = table
        self.namespace = namespace
        self.metrics = metrics or StoreMetrics()

    @classmethod
    def from_settings(cls, settings: Settings, namespace: str) -> DynamoRecords:
        if not settings.dynamodb_table:
            raise InvalidArgument('cas="dynamodb" needs dynamodb_table (SLATEPY_DYNAMODB_TABLE)')
        return cls(dynamodb_client(settings), settings.dynamodb_table, namespace)

    def claim(self, destination: str, source: str) -> None:
        """Step 2: put ``{source, destination, committed=false}`` unless ``destination`` has one.

        Raises:
            RecordExists: a record for ``destination`` exists (carrying it when readable).
        """
        item = {
            **self._key(destination),
            "source": {"S": source},
            "committed": {"BOOL": False},
            "created": {"N": f"{time.time():.3f}"},
        }
        try:
            self._call(
                "PutItem",
                destination,
                True,
                lambda: self._client.put_item(
                    TableName=self.table,
                    Item=item,
                    ConditionExpression="attribute_not_exists(pk)",
                ),
            )
        except ClientError as exc:
            if _code(exc) != "ConditionalCheckFailedException":
                raise
            raise RecordExists(self.get(destination)) from exc

    def get(self, destination: str) -> Record | None:
        reply = self._call(
            "GetItem",
            destination,
            False,
            lambda: self._client.get_item(
                TableName=self.table, Key=self._key(destination), ConsistentRead=True
            ),
        )
        item = reply.get("Item")
        return None if item is None else _record(item)

    def mark_committed(self, destination: str, source: str) -> bool:
        """Step 4: mark the record of ``destination`` committed if it still names ``source``.

        Conditional, never an upsert: if the record was completed and collected meanwhile (or
        replaced by a newer claim, whose own putter completes it), there is nothing to mark,
        and an unconditional ``UpdateItem`` would create a record without ``source`` that
        breaks every later read of it. Idempotent.

        Returns:
            False when no record for ``destination`` names ``source`` (already done).
        """
        try:
            self._call(
                "UpdateItem",
                destination,
                True,
                lambda: self._client.update_item(
                    TableName=self.table,
                    Key=self._key(destination),
                    UpdateExpression="SET committed = :t",
                    ConditionExpression="attribute_exists(pk) AND #source = :s",
                    ExpressionAttributeNames={"#source": "source"},  # SOURCE is reserved
                    ExpressionAttributeValues={":t": {"BOOL": True}, ":s": {"S": source}},
                ),
            )
        except ClientError as exc:
            if _code(exc) != "ConditionalCheckFailedException":
                raise
            return False
        return True

    def delete(self, destination: str) -> None:
        self._call(
            "DeleteItem",
            destination,
            True,
            lambda: self._client.delete_item(TableName=self.table, Key=self._key(destination)),
        )

    def delete_if_source(self, destination: str, source: str) -> bool:
        """Delete the record of ``destination`` only if it still names ``source``.

        The condition keeps a newer claim of the same destination (made after this record was
        dropped by someone else) from being deleted by a caller that looked at the old one.

        Returns:
            True if this call deleted the record, False if no record names ``source``.
        """
        try:
            self._call(
                "DeleteItem",
                destination,
                True,
                lambda: self._client.delete_item(
                    TableName=self.table,
                    Key=self._key(destination),
                    ConditionExpression="#source = :s",
                    ExpressionAttributeNames={"#source": "source"},
                    ExpressionAttributeValues={":s": {"S": source}},
                ),
            )
        except ClientError as exc:
            if _code(exc) != "ConditionalCheckFailedException":
                raise
            return False
        return True

    def pending(self, prefix: str = "", after: str | None = None) -> list[Record]:
        """Uncommitted records with destination under ``prefix`` (and > ``after``), in order."""
        low = prefix if after is None or after < prefix else after
        found: list[Record] = []
        start: dict[str, Any] | None = None
        values: dict[str, Any] = {
            ":pk": {"S": self.namespace},
            ":hi": {"S": prefix + _KEY_END},
            ":f": {"BOOL": False},
        }
        condition = "pk = :pk AND sk < :hi"  # DynamoDB refuses an empty key value
        if low:
            condition = "pk = :pk AND sk BETWEEN :lo AND :hi"
            values[":lo"] = {"S": low}
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self.table,
                "KeyConditionExpression": condition,
                "FilterExpression": "committed = :f",
                "ExpressionAttributeValues": values,
                "ConsistentRead": True,
            }
            if start is not None:
                kwargs["ExclusiveStartKey"] = start
            reply = self._call("Query", prefix, False, partial(self._client.query, **kwargs))
            found += [
                r
                for r in map(_record, reply.get("Items", []))
                if after is None or r.destination > after
            ]
            start = reply.get("LastEvaluatedKey")
            if not start:
                return found

    def _key(self, destination: str) -> dict[str, Any]:
        return {"pk": {"S": self.namespace}, "sk": {"S": destination}}

    def _call(self, operation: str, path: str, mutating: bool, fn: Any) -> Any:
        error = False
        try:
            return fn()
        except ClientError as exc:
            error = True
            code = _code(exc)
            if code == "ConditionalCheckFailedException":
                raise
            if code == "ResourceNotFoundException":
                raise NotFound(
                    f"DynamoDB table {self.table!r} does not exist "
                    "(create it with `slatepy dynamodb create-table`)",
                    path=path,
                ) from exc
            raise StoreUnavailable(
                f"DynamoDB {operation} for {path} failed: {code}: {exc}",
                path=path,
                definite=not mutating,
            ) from exc
        except BotoCoreError as exc:
            error = True
            raise StoreUnavailable(
                f"DynamoDB {operation} for {path} failed: {exc}", path=path, definite=not mutating
            ) from exc
        finally:
            self.metrics.record(f"dynamodb.{operation}", error=error)


def dynamodb_client(settings: Settings) -> DynamoDBClient:
    """A boto3 DynamoDB client from settings (falling back to ``AWS_*`` and boto3's chain)."""
    config = Config(
        connect_timeout=settings.store_timeout,
        read_timeout=settings.store_timeout,
        retries={"mode": "standard", "max_attempts": settings.store_retries + 1},
    )
    return boto3.client(
        "dynamodb",
        endpoint_url=settings.dynamodb_endpoint,
        region_name=settings.dynamodb_region or settings.s3_region or "us-east-1",
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=settings.s3_secret_access_key,
        aws_session_token=settings.s3_session_token,
        config=config,
    )


def create_table(settings: Settings, *, wait: bool = True) -> bool:
    """Create the two-phase table (on-demand billing); False if it already existed.

    Raises:
        InvalidArgument: ``dynamodb_table`` is not set.
        StoreUnavailable: DynamoDB refused or could not be reached.
    """
    if not settings.dynamodb_table:
        raise InvalidArgument("dynamodb_table is not set (SLATEPY_DYNAMODB_TABLE)")
    client = dynamodb_client(settings)
    try:
        _create(client, settings.dynamodb_table)
    except ClientError as exc:
        if _code(exc) == "ResourceInUseException":
            return False
        raise StoreUnavailable(f"creating table {settings.dynamodb_table}: {exc}") from exc
    except BotoCoreError as exc:
        raise StoreUnavailable(f"creating table {settings.dynamodb_table}: {exc}") from exc
    if wait:
        client.get_waiter("table_exists").wait(
            TableName=settings.dynamodb_table, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )
    return True


def _create(client: DynamoDBClient, table: str) -> None:
    client.create_table(
        TableName=table,
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def _record(item: dict[str, Any]) -> Record:
    """Parse an item; one that lacks an attribute a claim always writes is ``CorruptionError``.

    Such items are not claims: an older slatepy's unconditional step 4 could upsert a record
    with only ``committed`` after the real one was collected.
    """
    destination = item.get("sk", {}).get("S", "<no sort key>")
    try:
        return Record(
            destination=item["sk"]["S"],
            source=item["source"]["S"],
            committed=item["committed"]["BOOL"],
            created=float(item["created"]["N"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptionError(
            f"two-phase record for {destination} is malformed ({type(exc).__name__}: {exc}; "
            f"attributes {sorted(item)}): it is not a claim. If {destination} exists or is "
            "not wanted, delete the item from the DynamoDB table"
        ) from None


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
