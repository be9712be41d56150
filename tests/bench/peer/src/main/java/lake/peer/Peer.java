package lake.peer;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.math.RoundingMode;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.LogAndContinueExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The product's foreign-key and list joins as a Kafka Streams application: the peer a user would
 * pick instead, run on the same broker and topics to compare outputs and speed (docs/benchmarks.md).
 *
 * <ul>
 *   <li>{@code fk}: the KIP-213 foreign-key left join of products with merchants, projected as the
 *       marketplace pipeline's {@code display_products}: title, price as decimal(10,2), merchant_id,
 *       merchant, merchant_city.
 *   <li>{@code list}: persons' address-id lists enriched from addresses in list order, as the people
 *       pipeline's {@code people_with_addresses}: each element {id, matched, street, city}. Each list
 *       is exploded into one record per position (only changed positions are sent again), the
 *       positions are foreign-key joined with addresses, gathered back per person and laid out in the
 *       order of the person's current list.
 * </ul>
 *
 * <p>Values are JSON; a null field is left out (as Spark's {@code to_json} does). A record that is not
 * JSON is logged and skipped. Prints {@code peer: RUNNING} once the application runs.
 *
 * <p>Usage: {@code Peer --topology fk|list --bootstrap HOST:PORT --app-id ID --left TOPIC --right TOPIC
 * --out TOPIC [--threads N] [--commit-ms N] [--state-dir DIR] [-X key=value ...]}
 */
public final class Peer {
  static final ObjectMapper JSON =
      new ObjectMapper().enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS);
  static final Serde<JsonNode> JSON_SERDE = new JsonSerde();
  static final Serde<String> KEYS = Serdes.String();

  private Peer() {}

  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    String topology = null, left = null, right = null, out = null;
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
    props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, JsonSerde.class.getName());
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "100");
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "2");
    props.put(
        StreamsConfig.DESERIALIZATION_EXCEPTION_HANDLER_CLASS_CONFIG,
        LogAndContinueExceptionHandler.class.getName());
    for (int i = 0; i < args.length; i += 2) {
      if (i + 1 >= args.length) {
        throw new IllegalArgumentException("peer: " + args[i] + " needs a value");
      }
      String value = args[i + 1];
      switch (args[i]) {
        case "--topology" -> topology = value;
        case "--bootstrap" -> props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, value);
        case "--app-id" -> props.put(StreamsConfig.APPLICATION_ID_CONFIG, value);
        case "--left" -> left = value;
        case "--right" -> right = value;
        case "--out" -> out = value;
        case "--threads" -> props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, value);
        case "--commit-ms" -> props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, value);
        case "--state-dir" -> props.put(StreamsConfig.STATE_DIR_CONFIG, value);
        case "-X" -> {
          int eq = value.indexOf('=');
          props.put(value.substring(0, eq), value.substring(eq + 1));
        }
        default -> throw new IllegalArgumentException("peer: unknown argument " + args[i]);
      }
    }
    if (topology == null || left == null || right == null || out == null) {
      throw new IllegalArgumentException("peer: --topology, --left, --right and --out are required");
    }
    if (!props.containsKey(StreamsConfig.STATE_DIR_CONFIG)) {
      props.put(StreamsConfig.STATE_DIR_CONFIG, Files.createTempDirectory("peer-state").toString());
    }
    Topology built =
        switch (topology) {
          case "fk" -> fkJoin(left, right, out);
          case "list" -> listJoin(left, right, out);
          default -> throw new IllegalArgumentException("peer: --topology is fk or list, got " + topology);
        };
    KafkaStreams streams = new KafkaStreams(built, props);
    CountDownLatch stopped = new CountDownLatch(1);
    streams.setStateListener(
        (now, before) -> {
          if (now == KafkaStreams.State.RUNNING && before == KafkaStreams.State.REBALANCING) {
            System.out.println("peer: RUNNING");
            System.out.flush();
          }
          if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
            stopped.countDown();
          }
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close();
                  stopped.countDown();
                }));
    streams.start();
    stopped.await();
    System.exit(streams.state() == KafkaStreams.State.ERROR ? 1 : 0);
  }

  // --- the foreign-key join ---------------------------------------------------------------------

  static Topology fkJoin(String products, String merchants, String out) {
    StreamsBuilder b = new StreamsBuilder();
    KTable<String, JsonNode> left = b.table(products, Consumed.with(KEYS, JSON_SERDE));
    KTable<String, JsonNode> right = b.table(merchants, Consumed.with(KEYS, JSON_SERDE));
    left.leftJoin(right, Peer::merchantId, Peer::displayProduct)
        .toStream()
        .to(out, Produced.with(KEYS, JSON_SERDE));
    return b.build();
  }

  static String merchantId(JsonNode product) {
    JsonNode id = product.get("merchant_id");
    return id == null || id.isNull() ? null : id.asText();
  }

  static JsonNode displayProduct(JsonNode product, JsonNode merchant) {
    ObjectNode o = JSON.createObjectNode();
    put(o, "title", product.get("title"));
    JsonNode price = product.get("price");
    if (price != null && price.isNumber()) {
      o.put("price", price.decimalValue().setScale(2, RoundingMode.HALF_UP));
    }
    put(o, "merchant_id", product.get("merchant_id"));
    if (merchant != null) {
      put(o, "merchant", merchant.get("name"));
      put(o, "merchant_city", merchant.get("city"));
    }
    return o;
  }

  // --- the list join ----------------------------------------------------------------------------

  static final String LISTS = "person-lists";

  static Topology listJoin(String persons, String addresses, String out) {
    StreamsBuilder b = new StreamsBuilder();
    b.addStateStore(
        Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(LISTS), KEYS, JSON_SERDE));
    KStream<String, JsonNode> personUpdates = b.stream(persons, Consumed.with(KEYS, JSON_SERDE));
    KTable<String, JsonNode> people = personUpdates.toTable(Materialized.with(KEYS, JSON_SERDE));
    KTable<String, JsonNode> addressTable = b.table(addresses, Consumed.with(KEYS, JSON_SERDE));
    // one record per list position, keyed "<position>:<person>"; a shorter list retracts the rest
    KTable<String, JsonNode> positions =
        personUpdates
            .process(Explode::new, LISTS)
            .repartition(Repartitioned.with(KEYS, JSON_SERDE).withName("positions"))
            .toTable(Materialized.with(KEYS, JSON_SERDE));
    KTable<String, JsonNode> joined =
        positions.leftJoin(
            addressTable,
            position -> position.get("id").asText(),
            (position, address) -> {
              ObjectNode e = position.deepCopy();
              e.put("matched", address != null);
              if (address != null) {
                put(e, "street", address.get("street"));
                put(e, "city", address.get("city"));
              }
              return e;
            },
            Materialized.with(KEYS, JSON_SERDE));
    // gathered back per person: position -> enriched element
    KTable<String, JsonNode> gathered =
        joined
            .groupBy(
                (key, e) -> KeyValue.pair(e.get("person").asText(), e),
                Grouped.with("by-person", KEYS, JSON_SERDE))
            .aggregate(
                JSON::createObjectNode,
                // the aggregate is a fresh object per call (the store and its cache keep bytes), so
                // it is updated in place: a copy would cost a long list's size per element
                (person, e, agg) -> {
                  ((ObjectNode) agg).set(e.get("i").asText(), e);
                  return agg;
                },
                (person, e, agg) -> {
                  ((ObjectNode) agg).remove(e.get("i").asText());
                  return agg;
                },
                Materialized.with(KEYS, JSON_SERDE));
    people
        .leftJoin(gathered, Peer::personWithAddresses)
        .toStream()
        .to(out, Produced.with(KEYS, JSON_SERDE));
    return b.build();
  }

  static List<String> ids(JsonNode person) {
    List<String> out = new ArrayList<>();
    JsonNode list = person == null ? null : person.get("address_ids");
    if (list != null && list.isArray()) {
      list.forEach(id -> out.add(id.asText()));
    }
    return out;
  }

  static JsonNode personWithAddresses(JsonNode person, JsonNode gathered) {
    ObjectNode o = JSON.createObjectNode();
    put(o, "name", person.get("name"));
    ArrayNode list = o.putArray("addresses");
    List<String> ids = ids(person);
    for (int i = 0; i < ids.size(); i++) {
      JsonNode e = gathered == null ? null : gathered.get(Integer.toString(i));
      ObjectNode element = JSON.createObjectNode();
      element.put("id", ids.get(i));
      if (e != null && ids.get(i).equals(e.get("id").asText())) {
        element.put("matched", e.get("matched").asBoolean());
        put(element, "street", e.get("street"));
        put(element, "city", e.get("city"));
      } else {
        element.put("matched", false); // not joined yet: the next update of this position fills it
      }
      list.add(element);
    }
    return o;
  }

  /** A person's list as one record per position, sending only the positions that changed. */
  static final class Explode implements Processor<String, JsonNode, String, JsonNode> {
    private ProcessorContext<String, JsonNode> context;
    private KeyValueStore<String, JsonNode> lists;

    @Override
    public void init(ProcessorContext<String, JsonNode> context) {
      this.context = context;
      this.lists = context.getStateStore(LISTS);
    }

    @Override
    public void process(Record<String, JsonNode> record) {
      String person = record.key();
      if (person == null) {
        return;
      }
      List<String> now = ids(record.value());
      List<String> before = ids(lists.get(person));
      for (int i = 0; i < now.size(); i++) {
        if (i < before.size() && before.get(i).equals(now.get(i))) {
          continue;
        }
        ObjectNode position = JSON.createObjectNode();
        position.put("person", person);
        position.put("i", i);
        position.put("id", now.get(i));
        context.forward(record.withKey(i + ":" + person).withValue(position));
      }
      for (int i = now.size(); i < before.size(); i++) {
        context.forward(record.withKey(i + ":" + person).withValue(null));
      }
      if (record.value() == null) {
        lists.delete(person);
      } else {
        ObjectNode kept = JSON.createObjectNode();
        ArrayNode array = kept.putArray("address_ids");
        now.forEach(array::add);
        lists.put(person, kept);
      }
    }
  }

  // --- JSON -------------------------------------------------------------------------------------

  static void put(ObjectNode o, String field, JsonNode value) {
    if (value != null && !value.isNull()) {
      o.set(field, value);
    }
  }

  /** JSON values (the default value serde, so internal stores and topics need no explicit one). */
  public static final class JsonSerde extends Serdes.WrapperSerde<JsonNode> {
    public JsonSerde() {
      super(new JsonSerializer(), new JsonDeserializer());
    }
  }

  static final class JsonSerializer implements Serializer<JsonNode> {
    @Override
    public byte[] serialize(String topic, JsonNode data) {
      if (data == null) {
        return null;
      }
      try {
        return JSON.writeValueAsBytes(data);
      } catch (IOException e) {
        throw new SerializationException(e);
      }
    }
  }

  static final class JsonDeserializer implements Deserializer<JsonNode> {
    @Override
    public JsonNode deserialize(String topic, byte[] data) {
      if (data == null) {
        return null;
      }
      try {
        return JSON.readTree(data);
      } catch (IOException e) {
        throw new SerializationException("not JSON: " + e.getMessage());
      }
    }
  }
}
