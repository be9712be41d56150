package lake.joins;

import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;

import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

/**
 * The list join's state, in Spark's state store: a left value holding a list of ids into the right
 * table, as three chained operators in one streaming query.
 *
 * <ol>
 *   <li>{@link Memberships}, by left key: the accepted left version and its list. A new version
 *       subscribes the ids it added and unsubscribes the ids it removed (an id counts once however
 *       often the list holds it), and sends the row itself on to the third operator.
 *   <li>{@link Members}, by element id: the right side's accepted version and the left keys whose
 *       list holds the id. A subscription is answered with the current right value; a right change
 *       with the new value for every holder and no one else; an unsubscribe with a retraction.
 *   <li>{@link Rows}, by left key: the row and, per id of its list, the right value it was joined
 *       with (the element cache). It applies the batch's answers and emits the row with the right
 *       value of every position, in the list's order, duplicates kept.
 * </ol>
 *
 * <p>Output, per left key that changed: {@code key}, {@code left_value}, {@code left_partition},
 * {@code left_offset}, {@code items}, {@code ids}, {@code right_values}, {@code right_partitions},
 * {@code right_offsets} (per position: the right value and its record; null when the id has no live
 * right record), {@code live}, {@code changed}, {@code left_deleted}, the record counts and the
 * element counts (joined: looked up because added or their right record changed; retracted; kept).
 */
public final class ListJoin {
  private ListJoin() {}

  static final int SUBSCRIBE = 0;
  static final int UNSUBSCRIBE = 1;
  static final int ROW = 2; // the left row itself (value null: deleted), on its way to Rows
  static final int RIGHT = 3;
  static final int COUNT = 4;
  static final int ELEMENT = 5; // an id's right value for a left key
  static final int RETRACT = 6; // the id left the left key's list

  /** Between the operators: the route (the group of the next operator), the op and its payload. */
  static final StructType OPS =
      new StructType()
          .add("route", DataTypes.BinaryType)
          .add("op", DataTypes.IntegerType)
          .add("key", DataTypes.BinaryType) // the left key (a right record's own key for RIGHT)
          .add("id", DataTypes.BinaryType)
          .add("value", DataTypes.BinaryType) // ROW: the left value; RIGHT, ELEMENT: the right value
          .add("ts", DataTypes.LongType)
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType)
          .add("left_deleted", DataTypes.BooleanType)
          .add("n_left", DataTypes.IntegerType)
          .add("n_right", DataTypes.IntegerType)
          .add("items", DataTypes.createArrayType(DataTypes.StringType))
          .add("ids", DataTypes.createArrayType(DataTypes.BinaryType))
          .add("since", DataTypes.LongType) // ROW, ELEMENT: the version's value time
          .add("from_partition", DataTypes.IntegerType) // ROW, ELEMENT: the record that gave it
          .add("from_offset", DataTypes.LongType);

  static final StructType LEFT =
      new StructType()
          .add("value", DataTypes.BinaryType)
          .add("ts", DataTypes.LongType)
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType)
          .add("items", DataTypes.createArrayType(DataTypes.StringType))
          .add("ids", DataTypes.createArrayType(DataTypes.BinaryType))
          .add("from_partition", DataTypes.IntegerType)
          .add("from_offset", DataTypes.LongType)
          .add("since", DataTypes.LongType);

  /**
   * An element's right value as last answered, its value time and its record (null: no right
   * record).
   */
  static final StructType CACHED =
      new StructType()
          .add("value", DataTypes.BinaryType)
          .add("since", DataTypes.LongType)
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType);

  public static final StructType OUTPUT =
      new StructType()
          .add("key", DataTypes.BinaryType)
          .add("left_value", DataTypes.BinaryType)
          .add("left_partition", DataTypes.IntegerType) // the left value's record (provenance)
          .add("left_offset", DataTypes.LongType)
          .add("items", DataTypes.createArrayType(DataTypes.StringType))
          .add("ids", DataTypes.createArrayType(DataTypes.BinaryType))
          .add("right_values", DataTypes.createArrayType(DataTypes.BinaryType))
          .add("right_partitions", DataTypes.createArrayType(DataTypes.IntegerType))
          .add("right_offsets", DataTypes.createArrayType(DataTypes.LongType))
          .add("ts", DataTypes.LongType) // the left value time and its elements' right ones, the latest
          .add("live", DataTypes.BooleanType)
          .add("changed", DataTypes.BooleanType)
          .add("left_deleted", DataTypes.BooleanType)
          .add("n_left", DataTypes.IntegerType)
          .add("n_right", DataTypes.IntegerType)
          .add("elements_joined", DataTypes.IntegerType)
          .add("elements_retracted", DataTypes.IntegerType)
          .add("elements_kept", DataTypes.IntegerType);

  /**
   * The join over both topics' valid records ({@code side}, {@code key}, {@code value}, {@code
   * timestamp}, {@code partition}, {@code offset}, and a live left record's {@code items} and {@code
   * ids}). The join type (inner leaves unmatched elements out) is the projection's business.
   */
  public static Dataset<Row> apply(Dataset<Row> records, String type) {
    if (!List.of("inner", "left").contains(type)) {
      throw new IllegalArgumentException("list join type " + type);
    }
    Dataset<Row> memberships =
        records
            .filter("side = 'left'")
            .selectExpr(
                "key", "value", "unix_micros(timestamp) AS ts", "partition", "offset", "items", "ids")
            .groupByKey((MapFunction<Row, byte[]>) r -> (byte[]) r.get(0), Encoders.BINARY())
            .transformWithState(
                new Memberships(), TimeMode.None(), OutputMode.Append(), Encoders.row(OPS));
    Dataset<Row> right =
        records
            .filter("side = 'right'")
            .selectExpr(
                "key AS route",
                RIGHT + " AS op",
                "key",
                "key AS id",
                "value",
                "unix_micros(timestamp) AS ts",
                "partition",
                "offset",
                "false AS left_deleted",
                "0 AS n_left",
                "1 AS n_right",
                "CAST(NULL AS array<string>) AS items",
                "CAST(NULL AS array<binary>) AS ids",
                "CAST(NULL AS BIGINT) AS since",
                "CAST(NULL AS INT) AS from_partition",
                "CAST(NULL AS BIGINT) AS from_offset");
    return memberships
        .union(right)
        .groupByKey((MapFunction<Row, byte[]>) r -> (byte[]) r.get(0), Encoders.BINARY())
        .transformWithState(new Members(), TimeMode.None(), OutputMode.Append(), Encoders.row(OPS))
        .groupByKey((MapFunction<Row, byte[]>) r -> (byte[]) r.get(0), Encoders.BINARY())
        .transformWithState(new Rows(), TimeMode.None(), OutputMode.Append(), Encoders.row(OUTPUT));
  }

  static Row op(
      byte[] route,
      int op,
      byte[] key,
      byte[] id,
      Object value,
      Object ts,
      Object partition,
      Object offset,
      boolean leftDeleted,
      int nLeft,
      int nRight,
      Object items,
      Object ids,
      Object since) {
    return op(route, op, key, id, value, ts, partition, offset, leftDeleted, nLeft, nRight, items, ids,
        since, null, null);
  }

  static Row op(
      byte[] route,
      int op,
      byte[] key,
      byte[] id,
      Object value,
      Object ts,
      Object partition,
      Object offset,
      boolean leftDeleted,
      int nLeft,
      int nRight,
      Object items,
      Object ids,
      Object since,
      Object fromPartition,
      Object fromOffset) {
    return RowFactory.create(
        route, op, key, id, value, ts, partition, offset, leftDeleted, nLeft, nRight, items, ids, since,
        fromPartition, fromOffset);
  }

  /** The distinct non-null ids of a list version (none for a tombstone or no version). */
  static Set<ByteKey> ids(Row version) {
    Set<ByteKey> out = new LinkedHashSet<>();
    if (!TableJoin.live(version) || version.isNullAt(5)) return out;
    for (Object id : version.getList(5)) {
      if (id != null) out.add(new ByteKey((byte[]) id));
    }
    return out;
  }

  /** By left key: the accepted version and the memberships its changes send. */
  public static final class Memberships extends StatefulProcessor<byte[], Row, Row> {
    private static final long serialVersionUID = 1L;
    private transient ValueState<Row> left;

    @Override
    public void init(OutputMode mode, TimeMode time) {
      left = getHandle().getValueState("left", Encoders.row(LEFT), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        byte[] key, scala.collection.Iterator<Row> rows, TimerValues timers) {
      List<Row> versions = new ArrayList<>();
      while (rows.hasNext()) {
        Row r = rows.next(); // key, value, ts, partition, offset, items, ids
        versions.add(
            RowFactory.create(
                r.get(1), r.getLong(2), r.getInt(3), r.getLong(4), r.get(5), r.get(6), null, null, null));
      }
      int n = versions.size();
      Row old = left.exists() ? left.get() : null;
      Row best = TableJoin.advance(old, versions);
      List<Row> out = new ArrayList<>();
      if (best == old) {
        out.add(op(null, COUNT, key, null, null, null, null, null, false, n, 0, null, null, null));
        return CollectionConverters.asScala(out.iterator());
      }
      left.update(best);
      Set<ByteKey> before = ids(old);
      Set<ByteKey> after = ids(best);
      for (ByteKey id : before) {
        if (!after.contains(id)) {
          out.add(op(id.bytes, UNSUBSCRIBE, key, id.bytes, null, null, null, null, false, 0, 0, null, null, null));
        }
      }
      for (ByteKey id : after) {
        if (!before.contains(id)) {
          out.add(op(id.bytes, SUBSCRIBE, key, id.bytes, null, null, null, null, false, 0, 0, null, null, null));
        }
      }
      // a tombstone for a live row, or for a key never seen (forwarded, as Kafka Streams does); a
      // second tombstone of a deleted key changes nothing
      boolean deleted = !TableJoin.live(best) && (old == null || TableJoin.live(old));
      out.add(
          op(null, ROW, key, null, best.get(0), best.get(1), best.get(2), best.get(3), deleted, n, 0,
              best.get(4), best.get(5), TableJoin.since(best), TableJoin.fromPartition(best),
              TableJoin.fromOffset(best)));
      return CollectionConverters.asScala(out.iterator());
    }
  }

  /** By element id: the right side's accepted version, the left keys holding the id, the answers. */
  public static final class Members extends StatefulProcessor<byte[], Row, Row> {
    private static final long serialVersionUID = 1L;
    private transient ValueState<Row> right;
    private transient MapState<byte[], Boolean> holders;

    @Override
    public void init(OutputMode mode, TimeMode time) {
      right = getHandle().getValueState("right", Encoders.row(TableJoin.VERSION), TTLConfig.NONE());
      holders =
          getHandle().getMapState("holders", Encoders.BINARY(), Encoders.BOOLEAN(), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        byte[] id, scala.collection.Iterator<Row> rows, TimerValues timers) {
      List<Row> out = new ArrayList<>();
      List<byte[]> added = new ArrayList<>();
      List<Row> rights = new ArrayList<>();
      int nRight = 0;
      while (rows.hasNext()) {
        Row r = rows.next();
        int op = r.getInt(1);
        byte[] key = (byte[]) r.get(2);
        if (id == null) { // rows and counts, on to the left key's group
          out.add(
              op(key, op, key, null, r.get(4), r.get(5), r.get(6), r.get(7), r.getBoolean(8),
                  r.getInt(9), 0, r.get(11), r.get(12), r.get(13), r.get(14), r.get(15)));
        } else if (op == RIGHT) {
          nRight++;
          rights.add(
              RowFactory.create(r.get(4), r.getLong(5), r.getInt(6), r.getLong(7), null, null, null));
        } else if (op == SUBSCRIBE) {
          holders.updateValue(key, true);
          added.add(key);
        } else if (op == UNSUBSCRIBE) {
          holders.removeKey(key);
          out.add(op(key, RETRACT, key, id, null, null, null, null, false, 0, 0, null, null, null));
        }
      }
      if (id == null) return CollectionConverters.asScala(out.iterator());
      if (nRight > 0) {
        out.add(op(null, COUNT, null, null, null, null, null, null, false, 0, nRight, null, null, null));
      }
      Row old = right.exists() ? right.get() : null;
      Row current = TableJoin.advance(old, rights);
      boolean changed = current != old;
      if (changed) {
        right.update(current);
      }
      if (!changed) {
        for (byte[] key : added) out.add(element(key, id, current));
        return CollectionConverters.asScala(out.iterator());
      }
      // the right record changed: every holder (the new ones among them), streamed from the store
      return TableJoin.fanOut(out, holders.iterator(), (key, held) -> element(key, id, current));
    }

    private static Row element(byte[] key, byte[] id, Row right) {
      return op(key, ELEMENT, key, id, TableJoin.value(right), null, null, null, false, 0, 0, null, null,
          TableJoin.since(right), TableJoin.fromPartition(right), TableJoin.fromOffset(right));
    }
  }

  /** By left key: the row, its element cache, and the row with every position's right value. */
  public static final class Rows extends StatefulProcessor<byte[], Row, Row> {
    private static final long serialVersionUID = 1L;
    private transient ValueState<Row> row;
    private transient MapState<byte[], Row> cache;

    @Override
    public void init(OutputMode mode, TimeMode time) {
      row = getHandle().getValueState("row", Encoders.row(LEFT), TTLConfig.NONE());
      cache = getHandle().getMapState("cache", Encoders.BINARY(), Encoders.row(CACHED), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        byte[] key, scala.collection.Iterator<Row> rows, TimerValues timers) {
      int nLeft = 0;
      int nRight = 0;
      int joined = 0;
      int retracted = 0;
      boolean changed = false;
      boolean deleted = false;
      Long deletedAt = null; // the value time of the batch's tombstone of the row
      while (rows.hasNext()) {
        Row r = rows.next();
        int op = r.getInt(1);
        nLeft += r.getInt(9);
        nRight += r.getInt(10);
        if (key == null) continue; // counts only: the null group keeps no state
        if (op == ROW) {
          changed = true;
          deleted = r.getBoolean(8);
          if (r.isNullAt(4)) {
            row.clear();
            deletedAt = r.isNullAt(13) ? null : r.getLong(13);
          } else {
            row.update(
                RowFactory.create(
                    r.get(4), r.get(5), r.get(6), r.get(7), r.get(11), r.get(12), r.get(14), r.get(15),
                    r.get(13)));
          }
        } else if (op == ELEMENT) {
          changed = true;
          joined++;
          cache.updateValue(
              (byte[]) r.get(3), RowFactory.create(r.get(4), r.get(13), r.get(14), r.get(15)));
        } else if (op == RETRACT) {
          changed = true;
          retracted++;
          cache.removeKey((byte[]) r.get(3));
        }
      }
      List<Row> out = new ArrayList<>(1);
      if (!changed) {
        if (nLeft > 0 || nRight > 0) {
          out.add(
              RowFactory.create(
                  null, null, null, null, null, null, null, null, null, null, false, false, false, nLeft,
                  nRight, 0, 0, 0));
        }
        return CollectionConverters.asScala(out.iterator());
      }
      Row current = row.exists() ? row.get() : null;
      List<Object> values = new ArrayList<>();
      List<Object> partitions = new ArrayList<>();
      List<Object> offsets = new ArrayList<>();
      int kept = 0;
      Long ts = deletedAt;
      if (current != null) {
        kept = Math.max(0, ids(current).size() - joined);
        ts = TableJoin.since(current);
        for (Object id : current.getList(5)) {
          Row cached = id == null ? null : cache.getValue((byte[]) id);
          values.add(cached == null ? null : cached.get(0));
          boolean matched = cached != null && !cached.isNullAt(0);
          partitions.add(matched ? cached.get(2) : null);
          offsets.add(matched ? cached.get(3) : null);
          if (cached != null && !cached.isNullAt(1)) ts = Math.max(ts, cached.getLong(1));
        }
      }
      out.add(
          RowFactory.create(
              key,
              current == null ? null : current.get(0),
              TableJoin.fromPartition(current),
              TableJoin.fromOffset(current),
              current == null ? null : current.get(4),
              current == null ? null : current.get(5),
              current == null ? null : CollectionConverters.asScala(values).toSeq(),
              current == null ? null : CollectionConverters.asScala(partitions).toSeq(),
              current == null ? null : CollectionConverters.asScala(offsets).toSeq(),
              ts,
              current != null,
              true,
              deleted,
              nLeft,
              nRight,
              joined,
              retracted,
              kept));
      return CollectionConverters.asScala(out.iterator());
    }
  }

  /** A byte array with value equality, for sets of ids. */
  static final class ByteKey {
    final byte[] bytes;

    ByteKey(byte[] bytes) {
      this.bytes = bytes;
    }

    @Override
    public boolean equals(Object o) {
      return o instanceof ByteKey && java.util.Arrays.equals(bytes, ((ByteKey) o).bytes);
    }

    @Override
    public int hashCode() {
      return java.util.Arrays.hashCode(bytes);
    }
  }
}
