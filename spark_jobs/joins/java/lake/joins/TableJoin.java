package lake.joins;

import java.sql.Timestamp;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.function.BiFunction;

import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The table-table join's state, in Spark's state store: per key, the accepted version of each side
 * (the latest record by (timestamp, offset, partition); a tombstone is a version without a value).
 *
 * <p>Input: records with {@code side} (left | right), {@code key}, {@code value} (null: tombstone),
 * {@code timestamp}, {@code partition}, {@code offset}. Output: one row per key that had records in
 * the micro-batch: both sides' values after it, where they came from (blame columns for quarantine),
 * whether the join holds a row for the key ({@code live}), whether anything changed, whether the
 * batch deleted a live left value ({@code left_deleted}: the changelog's tombstone), and how many
 * records of each side the key had.
 */
public final class TableJoin extends StatefulProcessor<byte[], Row, Row> {
  private static final long serialVersionUID = 1L;

  /** A side's accepted version of a key. */
  static final StructType VERSION =
      new StructType()
          .add("value", DataTypes.BinaryType)
          .add("ts", DataTypes.LongType) // microseconds
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType);

  public static final StructType OUTPUT =
      new StructType()
          .add("key", DataTypes.BinaryType)
          .add("left_value", DataTypes.BinaryType)
          .add("right_value", DataTypes.BinaryType)
          .add("__lp", DataTypes.IntegerType)
          .add("__lo", DataTypes.LongType)
          .add("__rp", DataTypes.IntegerType)
          .add("__ro", DataTypes.LongType)
          .add("live", DataTypes.BooleanType)
          .add("changed", DataTypes.BooleanType)
          .add("left_deleted", DataTypes.BooleanType)
          .add("n_left", DataTypes.IntegerType)
          .add("n_right", DataTypes.IntegerType);

  private final String type; // inner | left | outer
  private transient ValueState<Row> left;
  private transient ValueState<Row> right;

  public TableJoin(String type) {
    if (!List.of("inner", "left", "outer").contains(type)) {
      throw new IllegalArgumentException("join type " + type);
    }
    this.type = type;
  }

  /** The join's state operator over a stream of both topics' records. */
  public static Dataset<Row> apply(Dataset<Row> records, String type) {
    return records
        .groupByKey((MapFunction<Row, byte[]>) r -> r.getAs("key"), Encoders.BINARY())
        .transformWithState(
            new TableJoin(type), TimeMode.None(), OutputMode.Update(), Encoders.row(OUTPUT));
  }

  @Override
  public void init(OutputMode mode, TimeMode time) {
    left = getHandle().getValueState("left", Encoders.row(VERSION), TTLConfig.NONE());
    right = getHandle().getValueState("right", Encoders.row(VERSION), TTLConfig.NONE());
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(
      byte[] key, scala.collection.Iterator<Row> rows, TimerValues timers) {
    Row bestLeft = null;
    Row bestRight = null;
    int nLeft = 0;
    int nRight = 0;
    while (rows.hasNext()) {
      Row r = rows.next();
      Row version =
          RowFactory.create(
              r.getAs("value"),
              micros(r.getAs("timestamp")),
              r.<Integer>getAs("partition"),
              r.<Long>getAs("offset"));
      if ("left".equals(r.getAs("side"))) {
        nLeft++;
        if (newer(version, bestLeft)) bestLeft = version;
      } else {
        nRight++;
        if (newer(version, bestRight)) bestRight = version;
      }
    }
    Row oldLeft = left.exists() ? left.get() : null;
    Row oldRight = right.exists() ? right.get() : null;
    Row newLeft = oldLeft;
    Row newRight = oldRight;
    if (bestLeft != null && newer(bestLeft, oldLeft)) {
      newLeft = bestLeft;
      left.update(newLeft);
    }
    if (bestRight != null && newer(bestRight, oldRight)) {
      newRight = bestRight;
      right.update(newRight);
    }
    // a newer record with the same value (a producer's retry, a replayed backfill) changes no row
    boolean changed = !sameValue(newLeft, oldLeft) || !sameValue(newRight, oldRight);
    boolean leftDeleted = newLeft != oldLeft && !live(newLeft) && live(oldLeft);
    Row out =
        RowFactory.create(
            key,
            value(newLeft),
            value(newRight),
            newLeft == null ? null : newLeft.get(2),
            newLeft == null ? null : newLeft.get(3),
            newRight == null ? null : newRight.get(2),
            newRight == null ? null : newRight.get(3),
            joined(newLeft, newRight),
            changed,
            leftDeleted,
            nLeft,
            nRight);
    return CollectionConverters.asScala(Collections.singletonList(out).iterator());
  }

  private boolean joined(Row l, Row r) {
    switch (type) {
      case "inner":
        return live(l) && live(r);
      case "left":
        return live(l);
      default:
        return live(l) || live(r);
    }
  }

  static boolean live(Row version) {
    return version != null && !version.isNullAt(0);
  }

  static Object value(Row version) {
    return version == null ? null : version.get(0);
  }

  /** True when both versions hold the same value (a tombstone and nothing yet are the same). */
  static boolean sameValue(Row a, Row b) {
    return java.util.Arrays.equals((byte[]) value(a), (byte[]) value(b));
  }

  /** True when {@code a} comes after {@code b} (null: nothing yet) by (timestamp, offset, partition). */
  static boolean newer(Row a, Row b) {
    if (b == null) return true;
    int c = Long.compare(a.getLong(1), b.getLong(1));
    if (c == 0) c = Long.compare(a.getLong(3), b.getLong(3));
    if (c == 0) c = Integer.compare(a.getInt(2), b.getInt(2));
    return c > 0;
  }

  /**
   * {@code first}, then every entry of a map state mapped to a row, lazily: a fan-out to a hot key's
   * million subscribers streams out of the state store instead of being held in memory.
   */
  static <K, V> scala.collection.Iterator<Row> fanOut(
      List<Row> first,
      scala.collection.Iterator<Tuple2<K, V>> entries,
      BiFunction<K, V, Row> answer) {
    Iterator<Row> head = first.iterator();
    Iterator<Tuple2<K, V>> rest = CollectionConverters.asJava(entries);
    return CollectionConverters.asScala(
        new Iterator<Row>() {
          @Override
          public boolean hasNext() {
            return head.hasNext() || rest.hasNext();
          }

          @Override
          public Row next() {
            if (head.hasNext()) return head.next();
            if (!rest.hasNext()) throw new NoSuchElementException();
            Tuple2<K, V> e = rest.next();
            return answer.apply(e._1(), e._2());
          }
        });
  }

  static long micros(Timestamp t) {
    return Math.floorDiv(t.getTime(), 1000L) * 1_000_000L + t.getNanos() / 1000;
  }
}
