package lake.joins;

import java.sql.Timestamp;
import java.util.ArrayList;
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

  /**
   * A side's accepted version of a key: the newest record's value and (timestamp, partition, offset),
   * which order the records. Every version struct ends with the same three fields: {@code
   * from_partition} and {@code from_offset}, the record that gave the side its current value (the
   * provenance a result row carries), and {@code since}, that record's timestamp. A later record with
   * the same value changes none of them (as Kafka Streams' tables drop an idempotent update).
   */
  static final StructType VERSION =
      new StructType()
          .add("value", DataTypes.BinaryType)
          .add("ts", DataTypes.LongType) // microseconds
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType)
          .add("from_partition", DataTypes.IntegerType)
          .add("from_offset", DataTypes.LongType)
          .add("since", DataTypes.LongType);

  public static final StructType OUTPUT =
      new StructType()
          .add("key", DataTypes.BinaryType)
          .add("left_value", DataTypes.BinaryType)
          .add("right_value", DataTypes.BinaryType)
          .add("left_partition", DataTypes.IntegerType) // the left value's record (provenance)
          .add("left_offset", DataTypes.LongType)
          .add("right_partition", DataTypes.IntegerType) // the right value's record
          .add("right_offset", DataTypes.LongType)
          .add("ts", DataTypes.LongType) // the result's timestamp (microseconds): resultTs
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
    List<Row> lefts = new ArrayList<>();
    List<Row> rights = new ArrayList<>();
    while (rows.hasNext()) {
      Row r = rows.next();
      Row version =
          RowFactory.create(
              r.getAs("value"),
              micros(r.getAs("timestamp")),
              r.<Integer>getAs("partition"),
              r.<Long>getAs("offset"),
              null,
              null,
              null);
      ("left".equals(r.getAs("side")) ? lefts : rights).add(version);
    }
    Row oldLeft = left.exists() ? left.get() : null;
    Row oldRight = right.exists() ? right.get() : null;
    Row newLeft = advance(oldLeft, lefts);
    Row newRight = advance(oldRight, rights);
    if (newLeft != oldLeft) left.update(newLeft);
    if (newRight != oldRight) right.update(newRight);
    // a newer record with the same value (a producer's retry, a replayed backfill) changes no row
    boolean changed = !sameVersion(newLeft, oldLeft) || !sameVersion(newRight, oldRight);
    boolean leftDeleted = newLeft != oldLeft && !live(newLeft) && live(oldLeft);
    Row out =
        RowFactory.create(
            key,
            value(newLeft),
            value(newRight),
            fromPartition(newLeft),
            fromOffset(newLeft),
            fromPartition(newRight),
            fromOffset(newRight),
            resultTs(joined(newLeft, newRight), newLeft, newRight),
            joined(newLeft, newRight),
            changed,
            leftDeleted,
            lefts.size(),
            rights.size());
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

  /**
   * True when both versions hold the same value since the same time (two tombstones are the same:
   * neither shows a value). A tombstone and nothing yet are not: the tombstone is a record of the
   * key, whose time a result counts (Kafka Streams forwards it and its join answers again, with it).
   */
  static boolean sameVersion(Row a, Row b) {
    if (a == null || b == null) return a == b;
    return sameValue(a, b) && (value(a) == null || java.util.Objects.equals(since(a), since(b)));
  }

  /** When a version's value began (null: no version). */
  static Long since(Row version) {
    return version == null ? null : version.getLong(version.length() - 1);
  }

  /** The partition of the record that gave a live version its value (null: no value). */
  static Object fromPartition(Row version) {
    return live(version) ? version.get(version.length() - 3) : null;
  }

  /** The offset of the record that gave a live version its value (null: no value). */
  static Object fromOffset(Row version) {
    return live(version) ? version.get(version.length() - 2) : null;
  }

  /**
   * The version after {@code old} (null: none yet) once a batch's {@code records} of one side are
   * applied in (timestamp, offset, partition) order: the newest, with the time its value began (an
   * older record than the accepted version is late and changes nothing). Returns {@code old} itself
   * when nothing is newer. Records are version rows whose last three fields ({@code from_partition},
   * {@code from_offset}, {@code since}) are filled here: the record that began the run of equal
   * values the version ends.
   */
  static Row advance(Row old, List<Row> records) {
    records.sort((a, b) -> newer(a, b) ? 1 : newer(b, a) ? -1 : 0);
    Row current = old;
    for (Row r : records) {
      if (!newer(r, current)) continue;
      boolean same = current != null && sameValue(r, current);
      Object[] fields = new Object[r.length()];
      for (int i = 0; i < fields.length; i++) fields[i] = r.get(i);
      int n = fields.length;
      fields[n - 3] = same ? current.get(current.length() - 3) : r.get(2);
      fields[n - 2] = same ? current.get(current.length() - 2) : r.get(3);
      fields[n - 1] = same ? since(current) : r.getLong(1);
      current = RowFactory.create(fields);
    }
    return current;
  }

  /**
   * A result's timestamp (microseconds; null when no side has a version), as Kafka Streams gives
   * a join result: a live row's is the largest of its sides' value times (a side's tombstone
   * counts: it made that side null); a deleted row's is its deleting record's, the latest of the
   * sides that are tombstones.
   */
  static Long resultTs(boolean live, Row... versions) {
    Long out = null;
    Long any = null;
    for (Row v : versions) {
      Long t = since(v);
      if (t == null) continue;
      any = any == null ? t : Math.max(any, t);
      if (live || !live(v)) out = out == null ? t : Math.max(out, t);
    }
    return out == null ? any : out;
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
