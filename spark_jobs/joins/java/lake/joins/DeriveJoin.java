package lake.joins;

import java.util.ArrayList;
import java.util.Iterator;
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
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The derive join's state, in Spark's state store: a lookup keyed by a value of its master records
 * (e.g. e-mail to customer id), as two chained operators in one streaming query.
 *
 * <ol>
 *   <li>{@link FkJoin.Subscriptions}, grouped by the master key, keeps each master key's accepted
 *       version and its derived key: a change holds the new derived key and releases the old one.
 *   <li>{@link Holders}, grouped by the derived key, keeps the master keys that hold it with their
 *       versions, and answers a derived key that changed with its newest holder, by (timestamp,
 *       partition, offset): a derived row that a newer update wrote is never deleted by an older one
 *       moving away. A derived key nobody holds any more is answered with a delete.
 * </ol>
 *
 * <p>Output: {@code key} (the derived key), {@code master_key}, {@code left_value}, {@code left_partition},
 * {@code left_offset}, {@code live}, {@code changed}, {@code left_deleted} (always false: the result is not
 * keyed like the master topic), {@code n_left}, {@code n_right}, {@code n_null}.
 */
public final class DeriveJoin {
  private DeriveJoin() {}

  public static final StructType OUTPUT =
      new StructType()
          .add("key", DataTypes.BinaryType)
          .add("master_key", DataTypes.BinaryType)
          .add("left_value", DataTypes.BinaryType)
          .add("left_partition", DataTypes.IntegerType) // the holder's record (provenance)
          .add("left_offset", DataTypes.LongType)
          .add("ts", DataTypes.LongType) // the newest holder's value time; a delete's: the release's
          .add("live", DataTypes.BooleanType)
          .add("changed", DataTypes.BooleanType)
          .add("left_deleted", DataTypes.BooleanType)
          .add("n_left", DataTypes.IntegerType)
          .add("n_right", DataTypes.IntegerType)
          .add("n_null", DataTypes.IntegerType);

  /** The join over the master topic's valid records, {@code by} their derived key. */
  public static Dataset<Row> apply(Dataset<Row> records, String type) {
    if (!"inner".equals(type)) throw new IllegalArgumentException("derive join type " + type);
    return FkJoin.subscriptions(records, true)
        .groupByKey((MapFunction<Row, byte[]>) r -> (byte[]) r.get(0), Encoders.BINARY())
        .transformWithState(new Holders(), TimeMode.None(), OutputMode.Append(), Encoders.row(OUTPUT));
  }

  /** By derived key: the master keys that hold it, and its newest holder when they changed. */
  public static final class Holders extends StatefulProcessor<byte[], Row, Row> {
    private static final long serialVersionUID = 1L;
    private transient MapState<byte[], Row> holders;

    @Override
    public void init(OutputMode mode, TimeMode time) {
      holders =
          getHandle()
              .getMapState(
                  "holders", Encoders.BINARY(), Encoders.row(TableJoin.VERSION), TTLConfig.NONE());
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(
        byte[] derived, scala.collection.Iterator<Row> rows, TimerValues timers) {
      int n = 0;
      int nullKey = 0;
      boolean changed = false;
      Long released = null; // the latest value time of the batch's records that released the key
      while (rows.hasNext()) {
        Row r = rows.next(); // FkJoin.OPS
        n += r.getInt(8);
        nullKey += r.getInt(9);
        if (derived == null) continue; // only counts: the null group keeps no state
        int op = r.getInt(1);
        if (op == FkJoin.SUBSCRIBE) {
          Row version = FkJoin.Responses.version(r.get(3), r);
          holders.updateValue((byte[]) r.get(2), version);
          changed = true;
        } else if (op == FkJoin.UNSUBSCRIBE) {
          holders.removeKey((byte[]) r.get(2));
          changed = true;
          if (!r.isNullAt(10)) released = released == null ? r.getLong(10) : Math.max(released, r.getLong(10));
        }
      }
      List<Row> out = new ArrayList<>(2);
      if (n > 0 || nullKey > 0) {
        out.add(RowFactory.create(null, null, null, null, null, null, false, false, false, n, 0, nullKey));
      }
      if (changed) {
        byte[] master = null;
        Row newest = null;
        Iterator<Tuple2<byte[], Row>> all = CollectionConverters.asJava(holders.iterator());
        while (all.hasNext()) {
          Tuple2<byte[], Row> h = all.next();
          if (newest == null || newer(h._2(), newest)) {
            master = h._1();
            newest = h._2();
          }
        }
        out.add(
            RowFactory.create(
                derived,
                master,
                newest == null ? null : newest.get(0),
                TableJoin.fromPartition(newest),
                TableJoin.fromOffset(newest),
                newest == null ? released : TableJoin.since(newest),
                newest != null,
                true,
                false,
                0,
                0,
                0));
      }
      return CollectionConverters.asScala(out.iterator());
    }

    /** {@code a} after {@code b} by (timestamp, partition, offset): offsets order one partition only. */
    private static boolean newer(Row a, Row b) {
      int c = Long.compare(a.getLong(1), b.getLong(1));
      if (c == 0) c = Integer.compare(a.getInt(2), b.getInt(2));
      if (c == 0) c = Long.compare(a.getLong(3), b.getLong(3));
      return c > 0;
    }
  }
}
