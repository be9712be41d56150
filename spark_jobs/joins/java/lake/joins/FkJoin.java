package lake.joins;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

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
 * The foreign-key join's state, in Spark's state store, in the shape of Kafka Streams' KIP-213 join:
 * two chained operators in one streaming query.
 *
 * <ol>
 *   <li>{@link Subscriptions}, grouped by the left key, keeps each left key's accepted version and its
 *       foreign key. When the accepted version changes it sends a subscription (the new value) to its
 *       foreign key, and, when the foreign key moved, a silent unsubscribe to the old one; a tombstone
 *       sends a propagating unsubscribe (KS's DELETE_KEY_AND_PROPAGATE).
 *   <li>{@link Responses}, grouped by the foreign key, over those subscriptions and the right
 *       records: it keeps the right side's accepted version and, per subscribed left key, the left
 *       value. It applies the subscriptions first, then the right record: a subscription is answered
 *       with the current right value; a right change is answered for every subscriber, and for no
 *       one else (never a scan of the left side).
 * </ol>
 *
 * <p>Kafka Streams needs a third step (the left side drops responses to a stale subscription, by a
 * hash of the value) because its two sides run apart and race. Here both operators run in every
 * micro-batch one after the other, so a response always answers the subscription the batch ended
 * with: the second operator answers each left key at most once per batch, from its current foreign
 * key. Subscriptions with a null foreign key, and tombstones of a left key that held none, go to the
 * null group, which answers them without state.
 *
 * <p>Output: {@link TableJoin#OUTPUT} plus {@code n_null} (live left records with a null foreign
 * key), one row per answered left key; counting rows ({@code changed} false) carry the batch's record
 * counts.
 */
public final class FkJoin {
  private FkJoin() {}

  static final int SUBSCRIBE = 0; // the left key's value and foreign key (answer it)
  static final int UNSUBSCRIBE = 1; // the left key moved to another foreign key (silent)
  static final int DELETE = 2; // the left key was deleted (answer with a delete)
  static final int RIGHT = 3; // a right record
  static final int COUNT = 4; // only counts: the batch changed nothing for the left key

  /** Between the operators: the foreign key (the route), what to do, and a record or version. */
  static final StructType OPS =
      new StructType()
          .add("route", DataTypes.BinaryType)
          .add("op", DataTypes.IntegerType)
          .add("key", DataTypes.BinaryType)
          .add("value", DataTypes.BinaryType)
          .add("ts", DataTypes.LongType)
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType)
          .add("left_deleted", DataTypes.BooleanType)
          .add("n", DataTypes.IntegerType)
          .add("n_null", DataTypes.IntegerType)
          .add("since", DataTypes.LongType) // the version's value time (TableJoin.VERSION)
          .add("from_partition", DataTypes.IntegerType) // the record that gave it its value
          .add("from_offset", DataTypes.LongType);

  /** A left key's accepted version with its foreign key. */
  static final StructType LEFT =
      new StructType()
          .add("value", DataTypes.BinaryType)
          .add("ts", DataTypes.LongType)
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType)
          .add("fk", DataTypes.BinaryType)
          .add("from_partition", DataTypes.IntegerType)
          .add("from_offset", DataTypes.LongType)
          .add("since", DataTypes.LongType);

  public static final StructType OUTPUT = TableJoin.OUTPUT.add("n_null", DataTypes.IntegerType);

  /**
   * The join over both topics' valid records ({@code side}, {@code key}, {@code value},
   * {@code timestamp}, {@code partition}, {@code offset}, and {@code by}: a live left record's foreign
   * key). {@code type}: inner | left.
   */
  public static Dataset<Row> apply(Dataset<Row> records, String type) {
    if (!List.of("inner", "left").contains(type)) {
      throw new IllegalArgumentException("fk join type " + type);
    }
    Dataset<Row> ops = subscriptions(records, false);
    Dataset<Row> right =
        records
            .filter("side = 'right'")
            .selectExpr(
                "key AS route",
                RIGHT + " AS op",
                "key",
                "value",
                "unix_micros(timestamp) AS ts",
                "partition",
                "offset",
                "false AS left_deleted",
                "1 AS n",
                "0 AS n_null",
                "CAST(NULL AS BIGINT) AS since",
                "CAST(NULL AS INT) AS from_partition",
                "CAST(NULL AS BIGINT) AS from_offset");
    return ops.union(right)
        .groupByKey((MapFunction<Row, byte[]>) r -> (byte[]) r.get(0), Encoders.BINARY())
        .transformWithState(
            new Responses(type), TimeMode.None(), OutputMode.Append(), Encoders.row(OUTPUT));
  }

  /** The left records' subscriptions: {@link Subscriptions} over {@code records}' left side. */
  static Dataset<Row> subscriptions(Dataset<Row> records, boolean derive) {
    return records
        .filter("side = 'left'")
        .selectExpr("key", "value", "unix_micros(timestamp) AS ts", "partition", "offset", "by")
        .groupByKey((MapFunction<Row, byte[]>) r -> (byte[]) r.get(0), Encoders.BINARY())
        .transformWithState(
            new Subscriptions(derive), TimeMode.None(), OutputMode.Append(), Encoders.row(OPS));
  }

  /**
   * By left key: the accepted left version and the subscriptions its changes send. With {@code
   * derive} (the derive join's master records, their derived key as the route) a tombstone or a null
   * key only releases the old key: the derived key's holders decide what it shows.
   */
  public static final class Subscriptions extends StatefulProcessor<byte[], Row, Row> {
    private static final long serialVersionUID = 1L;
    private final boolean derive;
    private transient ValueState<Row> left;

    Subscriptions(boolean derive) {
      this.derive = derive;
    }

    @Override
    public void init(OutputMode mode, TimeMode time) {
      left = getHandle().getValueState("left", Encoders.row(LEFT), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        byte[] key, scala.collection.Iterator<Row> rows, TimerValues timers) {
      List<Row> versions = new ArrayList<>();
      int nullFk = 0;
      while (rows.hasNext()) {
        Row r = rows.next(); // key, value, ts, partition, offset, by
        if (!r.isNullAt(1) && r.isNullAt(5)) nullFk++;
        versions.add(
            RowFactory.create(
                r.get(1), r.getLong(2), r.getInt(3), r.getLong(4), r.get(5), null, null, null));
      }
      int n = versions.size();
      Row old = left.exists() ? left.get() : null;
      Row best = TableJoin.advance(old, versions);
      List<Row> out = new ArrayList<>(2);
      if (best != old) {
        left.update(best);
      }
      // a newer record with the same value (so the same foreign key) changes no joined row; for
      // derive it may (the newest holder of a derived key wins)
      if (best != old && (derive || !TableJoin.sameVersion(best, old))) {
        boolean wasLive = TableJoin.live(old);
        byte[] oldFk = wasLive ? (byte[]) old.get(4) : null;
        byte[] fk = TableJoin.live(best) ? (byte[]) best.get(4) : null;
        boolean moved = oldFk != null && !Arrays.equals(oldFk, fk);
        if (!TableJoin.live(best) && !derive) {
          out.add(op(oldFk, DELETE, key, best, wasLive)); // answered (the null group when it had none)
        } else {
          if (moved) out.add(op(oldFk, UNSUBSCRIBE, key, best, false));
          if (fk != null || (!derive && TableJoin.live(best))) {
            out.add(op(fk, SUBSCRIBE, key, best, false));
          }
        }
      }
      if (out.isEmpty()) {
        out.add(op(null, COUNT, key, null, false));
      }
      Row last = out.remove(out.size() - 1); // the batch's record counts ride on the last op
      out.add(withCounts(last, n, nullFk));
      return CollectionConverters.asScala(out.iterator());
    }

    private static Row op(byte[] route, int op, byte[] key, Row version, boolean leftDeleted) {
      return RowFactory.create(
          route,
          op,
          key,
          version == null ? null : version.get(0),
          version == null ? null : version.get(1),
          version == null ? null : version.get(2),
          version == null ? null : version.get(3),
          leftDeleted,
          0,
          0,
          TableJoin.since(version),
          TableJoin.fromPartition(version),
          TableJoin.fromOffset(version));
    }

    private static Row withCounts(Row op, int n, int nullFk) {
      Object[] values = new Object[op.length()];
      for (int i = 0; i < values.length; i++) values[i] = op.get(i);
      values[8] = n;
      values[9] = nullFk;
      return RowFactory.create(values);
    }
  }

  /** By foreign key: the right side's accepted version, the subscribers, and the answers. */
  public static final class Responses extends StatefulProcessor<byte[], Row, Row> {
    private static final long serialVersionUID = 1L;
    private final boolean inner;
    private transient ValueState<Row> right;
    private transient MapState<byte[], Row> subscribers;

    Responses(String type) {
      this.inner = "inner".equals(type);
    }

    @Override
    public void init(OutputMode mode, TimeMode time) {
      right = getHandle().getValueState("right", Encoders.row(TableJoin.VERSION), TTLConfig.NONE());
      subscribers =
          getHandle()
              .getMapState(
                  "subscribers", Encoders.BINARY(), Encoders.row(TableJoin.VERSION), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        byte[] fk, scala.collection.Iterator<Row> rows, TimerValues timers) {
      List<Row> answers = new ArrayList<>();
      List<Row> subscribed = new ArrayList<>();
      List<Row> deleted = new ArrayList<>(); // (key, tombstone version, left_deleted)
      List<Row> rights = new ArrayList<>();
      int nLeft = 0;
      int nRight = 0;
      int nullFk = 0;
      while (rows.hasNext()) {
        Row r = rows.next(); // OPS: route, op, key, value, ts, partition, offset, ..., since, from_*
        int op = r.getInt(1);
        nullFk += r.getInt(9);
        if (op == RIGHT) {
          nRight += r.getInt(8);
          rights.add(
              RowFactory.create(r.get(3), r.getLong(4), r.getInt(5), r.getLong(6), null, null, null));
          continue;
        }
        nLeft += r.getInt(8);
        byte[] key = (byte[]) r.get(2);
        if (op == DELETE) {
          if (fk != null) subscribers.removeKey(key);
          Row tombstone = version(null, r);
          deleted.add(RowFactory.create(key, tombstone, r.getBoolean(7)));
        } else if (op == UNSUBSCRIBE) {
          subscribers.removeKey(key);
        } else if (op == SUBSCRIBE) {
          Row version = version(r.get(3), r);
          if (fk == null) {
            answers.add(answer(key, version, null, false)); // nothing to join with, no state
          } else {
            subscribers.updateValue(key, version);
            subscribed.add(RowFactory.create(key, version));
          }
        }
      }
      Row current = null;
      boolean rightChanged = false;
      if (fk != null) {
        Row old = right.exists() ? right.get() : null;
        current = TableJoin.advance(old, rights);
        if (current != old) {
          rightChanged = !TableJoin.sameVersion(current, old); // the same value: no answer
          right.update(current);
        }
      }
      for (Row d : deleted) {
        answers.add(answer((byte[]) d.get(0), d.getStruct(1), current, d.getBoolean(2)));
      }
      if (nLeft > 0 || nRight > 0 || nullFk > 0) {
        answers.add(counts(nLeft, nRight, nullFk));
      }
      if (!rightChanged) {
        for (Row s : subscribed) answers.add(answer((byte[]) s.get(0), s.getStruct(1), current, false));
        return CollectionConverters.asScala(answers.iterator());
      }
      // the right record changed: every subscriber (the new ones among them), streamed from the store
      Row value = current;
      return TableJoin.fanOut(
          answers, subscribers.iterator(), (key, left) -> answer(key, left, value, false));
    }

    /** The version (TableJoin.VERSION) an OPS row carries, with {@code value}. */
    static Row version(Object value, Row r) {
      return RowFactory.create(
          value, r.getLong(4), r.getInt(5), r.getLong(6), r.get(11), r.get(12), r.get(10));
    }

    /**
     * A left key's joined row after the batch ({@code left} a tombstone: the left key is deleted),
     * with the right side's version of its foreign key (null: none).
     */
    private Row answer(byte[] key, Row left, Row right, boolean leftDeleted) {
      boolean live = TableJoin.live(left) && (!inner || TableJoin.live(right));
      boolean matched = TableJoin.live(right);
      boolean hasLeft = TableJoin.live(left);
      return RowFactory.create(
          key,
          TableJoin.value(left),
          matched ? right.get(0) : null,
          hasLeft ? TableJoin.fromPartition(left) : null,
          hasLeft ? TableJoin.fromOffset(left) : null,
          matched ? TableJoin.fromPartition(right) : null,
          matched ? TableJoin.fromOffset(right) : null,
          TableJoin.resultTs(live, left, right),
          live,
          true,
          leftDeleted,
          0,
          0,
          0);
    }

    private static Row counts(int nLeft, int nRight, int nullFk) {
      return RowFactory.create(
          null, null, null, null, null, null, null, null, false, false, false, nLeft, nRight, nullFk);
    }
  }
}
