package lake.kafka;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.udf;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Future;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * A join's changelog written by the executors, exactly once per micro-batch.
 *
 * <p>The batch's records ({@code key}, {@code v}: null for a tombstone, {@code ts}: epoch ms) are
 * partitioned by the changelog's partition (murmur2 of the key, as Kafka's producer does; a null key
 * by its value's hash), so that one task writes each Kafka partition. Each task writes its records in
 * one Kafka transaction whose transactional id is the join's and the partition's: a task that
 * replaces another (a retry, a replayed batch after a crash) opens its producer with the same id,
 * which fences the one it replaces and aborts that one's open transaction. A task that may replace
 * one that committed (a retry, or a batch the driver may be replaying) first reads the end of its
 * partition: a committed record there tagged with the batch means it went out, and the task sends
 * nothing. Every record carries the batch in the {@code lake.batch} header.
 *
 * <p>Producers stay open in the executor between batches (opening one costs a broker round trip),
 * at most {@link #KEPT} of them. A kept producer may have been fenced meanwhile by another executor's
 * producer of the same id (the partition's task ran there in between): its first record is sent
 * alone and waited for, and a producer that fails then is closed and replaced within the task, never
 * reused. A producer that fails later in a task is closed, and the task fails (Spark runs it again).
 */
public final class ChangelogWriter {
  static final String HEADER = "lake.batch";
  static final int TAIL_DEPTH = 8; // offsets read back per partition (they count commit markers too)
  static final int KEPT = 64;

  /** What each task that had records did: its partition, records sent, the last one's offset. */
  public static final StructType SENT =
      new StructType()
          .add("partition", DataTypes.IntegerType)
          .add("records", DataTypes.LongType)
          .add("last_offset", DataTypes.LongType)
          .add("already_sent", DataTypes.BooleanType);

  private static final Map<String, Kept> PRODUCERS =
      new LinkedHashMap<>(16, 0.75f, true) {
        @Override
        protected boolean removeEldestEntry(Map.Entry<String, Kept> eldest) {
          if (size() <= KEPT) {
            return false;
          }
          eldest.getValue().producer.close(Duration.ZERO);
          return true;
        }
      };

  private record Kept(String topicId, KafkaProducer<byte[], byte[]> producer) {}

  private ChangelogWriter() {}

  /**
   * Publish {@code records} to {@code topic} ({@code partitions} partitions, with the id {@code
   * topicId}: a recreated topic gets new producers) and return {@link #SENT}'s rows. {@code conf}:
   * the Kafka client's settings; {@code transactionalId}: the join's, to which each partition's
   * number is appended; {@code tag}: the batch; {@code mayBeSent}: the batch may be a replay;
   * {@code order}: the columns (comma-separated) to send each partition's records in (empty: any
   * order).
   */
  public static Dataset<Row> publish(
      Dataset<Row> records,
      Map<String, String> conf,
      String topic,
      String topicId,
      int partitions,
      String transactionalId,
      String tag,
      boolean mayBeSent,
      String order) {
    Map<String, String> settings = new HashMap<>(conf);
    UDF2<byte[], byte[], Integer> partitionOf = (key, value) -> partitionOf(key, value, partitions);
    Dataset<Row> routed =
        records
            .withColumn("__kp", udf(partitionOf, DataTypes.IntegerType).apply(col("key"), col("v")))
            .repartitionById(partitions, col("__kp"));
    if (!order.isEmpty()) {
      routed =
          routed.sortWithinPartitions(
              java.util.Arrays.stream(order.split(","))
                  .map(name -> col(name).asc_nulls_last())
                  .toArray(org.apache.spark.sql.Column[]::new));
    }
    routed = routed.select("key", "v", "ts");
    MapPartitionsFunction<Row, Row> task =
        rows -> send(rows, settings, topic, topicId, transactionalId, tag, mayBeSent);
    return routed.mapPartitions(task, Encoders.row(SENT));
  }

  /** The changelog partition of a record: Kafka's default partitioner for a key. */
  static int partitionOf(byte[] key, byte[] value, int partitions) {
    byte[] hashed = key != null ? key : value != null ? value : new byte[0];
    return Utils.toPositive(Utils.murmur2(hashed)) % partitions;
  }

  /**
   * The fault tests' crash points (spark_jobs/faults.py), in a task's first attempt of its stage's first: {@code
   * LAKE_KILL_AT=publish-open} once the task's open transaction has a record on the broker, {@code
   * publish-part} once partition 0's transaction is committed (the other partitions' tasks wait
   * before their commit, so theirs are open when the process dies).
   */
  private static boolean killAt(String point, TaskContext task) {
    return task.attemptNumber() == 0
        && task.stageAttemptNumber() == 0
        && point.equals(System.getenv("LAKE_KILL_AT"));
  }

  /**
   * End as kill -9 would: an executor's JVM alone (Spark runs its task again elsewhere), a local
   * Spark's JVM with the Python driver that started it (under spark-submit, Python is the JVM's child
   * and ends with it).
   */
  private static void die() {
    if ("driver".equals(SparkEnv.get().executorId())) {
      ProcessHandle.current()
          .parent()
          .filter(p -> p.info().command().orElse("").contains("python"))
          .ifPresent(ProcessHandle::destroyForcibly);
    }
    Runtime.getRuntime().halt(137);
  }

  /** Forget the producers of a join (its job stopped, or its changelog was reset). */
  public static void forget(String transactionalId) {
    synchronized (PRODUCERS) {
      PRODUCERS.entrySet().removeIf(e -> {
        boolean mine = e.getKey().startsWith(transactionalId + "-");
        if (mine) {
          e.getValue().producer.close(Duration.ZERO);
        }
        return mine;
      });
    }
  }

  private static Iterator<Row> send(
      Iterator<Row> rows,
      Map<String, String> conf,
      String topic,
      String topicId,
      String transactionalId,
      String tag,
      boolean mayBeSent) {
    if (!rows.hasNext()) {
      return Collections.emptyIterator();
    }
    TaskContext task = TaskContext.get();
    int partition = task.partitionId();
    String id = transactionalId + "-" + partition;
    boolean check = mayBeSent || task.attemptNumber() > 0 || task.stageAttemptNumber() > 0;
    byte[] tagBytes = tag.getBytes(StandardCharsets.UTF_8);
    List<Header> headers = List.of(new RecordHeader(HEADER, tagBytes));
    Row first = rows.next();
    KafkaProducer<byte[], byte[]> producer = null;
    Future<RecordMetadata> last = null;
    try {
      // A kept producer may have been fenced since its last batch: this partition's task ran on
      // another executor in between, whose producer of the same id fenced it. The fence only shows
      // when the producer next talks to its transaction coordinator, so a kept producer sends the
      // first record alone and waits for it; one that fails is closed and replaced by a new one
      // (whose initTransactions fences the other in turn), and the partition's tail is read first,
      // since the other may have published this batch. A fresh producer is not waited on.
      for (int round = 0; ; round++) {
        Opened opened = producer(id, topicId, conf);
        producer = opened.producer();
        try {
          producer.beginTransaction();
          if (check && sent(conf, topic, partition, tagBytes)) {
            producer.abortTransaction(); // nothing was sent in it
            return List.of(RowFactory.create(partition, 0L, -1L, true)).iterator();
          }
          last = producer.send(record(topic, partition, first, headers));
          if (opened.kept()) {
            last.get();
          }
          break;
        } catch (Exception stale) {
          if (!opened.kept() || round > 0) {
            throw stale;
          }
          drop(id);
          check = true;
          System.err.println(
              "lake.kafka.ChangelogWriter: the kept producer of " + id + " could not be used ("
                  + rootCause(stale) + "); opened a new one");
        }
      }
      if (killAt("publish-open", task)) {
        producer.flush(); // a record of the open transaction is on the broker
        die();
      }
      long count = 1;
      while (rows.hasNext()) {
        last = producer.send(record(topic, partition, rows.next(), headers));
        count++;
      }
      if (partition != 0 && killAt("publish-part", task)) {
        Thread.sleep(120_000); // uncommitted until partition 0's task, committed, ends the process
      }
      producer.commitTransaction();
      if (partition == 0 && killAt("publish-part", task)) { // one partition's transaction is committed
        die();
      }
      return List.of(RowFactory.create(partition, count, last.get().offset(), false)).iterator();
    } catch (Exception e) {
      drop(id); // closed, never reused: its transaction is aborted by the producer that takes the id next
      throw new KafkaException("publishing to " + topic + "[" + partition + "]: " + rootCause(e), e);
    }
  }

  private static ProducerRecord<byte[], byte[]> record(
      String topic, int partition, Row row, List<Header> headers) {
    byte[] key = row.isNullAt(0) ? null : (byte[]) row.get(0);
    byte[] value = row.isNullAt(1) ? null : (byte[]) row.get(1);
    Long ts = row.isNullAt(2) ? null : row.getLong(2);
    return new ProducerRecord<>(topic, partition, ts, key, value, headers);
  }

  private static String rootCause(Throwable e) {
    Throwable cause = e;
    while (cause.getCause() != null && cause.getCause() != cause) {
      cause = cause.getCause();
    }
    return cause.getClass().getSimpleName() + ": " + cause.getMessage();
  }

  /** A producer for a transactional id, and whether it was kept from an earlier task. */
  private record Opened(KafkaProducer<byte[], byte[]> producer, boolean kept) {}

  private static Opened producer(String id, String topicId, Map<String, String> conf) {
    synchronized (PRODUCERS) {
      Kept kept = PRODUCERS.get(id);
      if (kept != null && kept.topicId.equals(topicId)) {
        return new Opened(kept.producer, true);
      }
      if (kept != null) {
        PRODUCERS.remove(id).producer.close(Duration.ZERO);
      }
    }
    Map<String, Object> settings =
        forClient(conf, ProducerConfig.configNames(), ConsumerConfig.configNames());
    settings.put("transactional.id", id);
    settings.put("enable.idempotence", "true");
    settings.put("acks", "all");
    settings.put("key.serializer", ByteArraySerializer.class.getName());
    settings.put("value.serializer", ByteArraySerializer.class.getName());
    KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(settings);
    producer.initTransactions(); // fences the id's earlier producer, aborting its open transaction
    synchronized (PRODUCERS) {
      PRODUCERS.put(id, new Kept(topicId, producer));
    }
    return new Opened(producer, false);
  }

  private static void drop(String id) {
    Kept kept;
    synchronized (PRODUCERS) {
      kept = PRODUCERS.remove(id);
    }
    if (kept != null) {
      kept.producer.close(Duration.ZERO);
    }
  }

  /**
   * The settings of {@code conf} for a client whose own settings are {@code mine}: without those
   * only the other client knows ({@code others}). The cluster's settings hold a consumer's ({@code
   * fetch.max.wait.ms}) and a producer's ({@code linger.ms}, {@code transaction.timeout.ms}), which
   * the other client would log as unknown; a setting neither knows (a security plugin's) stays, as
   * plugins read the client's settings.
   */
  static Map<String, Object> forClient(
      Map<String, String> conf, Set<String> mine, Set<String> others) {
    Map<String, Object> settings = new HashMap<>();
    for (Map.Entry<String, String> e : conf.entrySet()) {
      if (mine.contains(e.getKey()) || !others.contains(e.getKey())) {
        settings.put(e.getKey(), e.getValue());
      }
    }
    return settings;
  }

  /** Whether a committed record among the last offsets of the partition carries {@code tag}. */
  static boolean sent(Map<String, String> conf, String topic, int partition, byte[] tag) {
    Map<String, Object> settings =
        forClient(conf, ConsumerConfig.configNames(), ProducerConfig.configNames());
    settings.put("isolation.level", "read_committed");
    settings.put("enable.auto.commit", "false");
    settings.put("key.deserializer", ByteArrayDeserializer.class.getName());
    settings.put("value.deserializer", ByteArrayDeserializer.class.getName());
    TopicPartition tp = new TopicPartition(topic, partition);
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(settings)) {
      Set<TopicPartition> one = Set.of(tp);
      consumer.assign(one);
      long low = consumer.beginningOffsets(one).get(tp);
      long end = consumer.endOffsets(one).get(tp); // read_committed: the last stable offset
      if (end <= low) {
        return false;
      }
      consumer.seek(tp, Math.max(low, end - TAIL_DEPTH));
      long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
      while (consumer.position(tp) < end) {
        if (System.nanoTime() > deadline) {
          throw new KafkaException("reading the end of " + tp + " timed out");
        }
        for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
          Header header = record.headers().lastHeader(HEADER);
          if (header != null && java.util.Arrays.equals(header.value(), tag)) {
            return true;
          }
        }
      }
      return false;
    }
  }
}
