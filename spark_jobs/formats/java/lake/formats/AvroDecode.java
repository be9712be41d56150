package lake.formats;

import java.io.IOException;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;

/**
 * Decodes Schema Registry framed Avro records on the executors: {@code struct<value, error>}, the
 * record read with its writer schema (by the id in its frame) into the reader schema (a subject's
 * version), or why it cannot be: no magic byte, truncated, a schema id the registry does not have or
 * that belongs to another subject, bytes that are not a record of its writer schema or bytes left
 * after it. Never a row of nulls that looks like data.
 *
 * <p>The schemas come from the driver, which asked the registry: {@code writers} maps each known id
 * of the subject to its schema, {@code foreign} an id outside the subject to the reason. An id in
 * neither is reported as unknown (the driver learns it from the registry and plans again).
 */
public final class AvroDecode implements UDF1<byte[], Row> {
  private static final long serialVersionUID = 1L;

  private final String subject;
  private final String readerJson;
  private final String writersJson;
  private final String foreignJson;
  private final RegistryLookup lookup;
  private transient Schema reader;
  private transient Map<Integer, GenericDatumReader<Object>> readers;
  private transient Map<Integer, String> foreign;
  private transient BinaryDecoder decoder;

  /**
   * @param subject the subject whose versions the records are written with (for the reasons)
   * @param readerJson the reader schema
   * @param writersJson {"id": "schema", ...}: the subject's versions
   * @param foreignJson {"id": "reason", ...}: ids outside the subject, and why they do not decode
   * @param registry the settings to ask the registry about an id none of these name with, as JSON
   *     (lake.formats.RegistryLookup; empty: none to ask)
   */
  public AvroDecode(
      String subject,
      String readerJson,
      String writersJson,
      String foreignJson, String registry) {
    this.subject = subject;
    this.readerJson = readerJson;
    this.writersJson = writersJson;
    this.foreignJson = foreignJson;
    this.lookup = new RegistryLookup(registry);
  }

  /** The Spark type of the decoded values of {@code readerJson}, as Spark's JSON of a type. */
  public static String sparkType(String readerJson) {
    return AvroTypes.sparkType(new Schema.Parser().parse(readerJson)).json();
  }

  /** The UDF's return type: {@code struct<value: the reader's type, error: string>}. */
  public static DataType returnType(String readerJson) {
    return DataTypes.createStructType(
        new org.apache.spark.sql.types.StructField[] {
          DataTypes.createStructField(
              "value", AvroTypes.sparkType(new Schema.Parser().parse(readerJson)), true),
          DataTypes.createStructField("error", DataTypes.StringType, true)
        });
  }

  private void open() throws IOException {
    ObjectMapper mapper = new ObjectMapper();
    reader = new Schema.Parser().parse(readerJson);
    readers = new HashMap<>();
    JsonNode writers = mapper.readTree(writersJson);
    for (Iterator<String> ids = writers.fieldNames(); ids.hasNext(); ) {
      String id = ids.next();
      Schema writer = new Schema.Parser().parse(writers.get(id).asText());
      readers.put(Integer.parseInt(id), new GenericDatumReader<>(writer, reader));
    }
    foreign = new HashMap<>();
    JsonNode reasons = mapper.readTree(foreignJson);
    for (Iterator<String> ids = reasons.fieldNames(); ids.hasNext(); ) {
      String id = ids.next();
      foreign.put(Integer.parseInt(id), reasons.get(id).asText());
    }
  }

  @Override
  public Row call(byte[] raw) throws Exception {
    if (raw == null) {
      return null;
    }
    if (readers == null) {
      open();
    }
    String problem = Framing.problem(raw);
    if (problem != null) {
      return RowFactory.create(null, problem);
    }
    int id = Framing.schemaId(raw);
    GenericDatumReader<Object> datumReader = readers.get(id);
    if (datumReader == null && !foreign.containsKey(id) && lookup.canAsk()) {
      learn(id); // a version registered since the job was planned, or another subject's schema
      datumReader = readers.get(id);
    }
    if (datumReader == null) {
      String reason = foreign.get(id);
      return RowFactory.create(
          null, reason != null ? reason : "unknown schema id " + id + " (not a version of " + subject + ")");
    }
    decoder = DecoderFactory.get().binaryDecoder(raw, 5, raw.length - 5, decoder);
    Object value;
    try {
      value = datumReader.read(null, decoder);
    } catch (IOException | RuntimeException e) {
      return RowFactory.create(
          null, "not an Avro record of schema id " + id + " (" + subject + "): " + describe(e));
    }
    if (!decoder.isEnd()) {
      return RowFactory.create(
          null,
          "bytes left after the Avro record of schema id " + id + " (" + subject + "): written with another schema?");
    }
    return RowFactory.create(AvroTypes.toSpark(value, reader), null);
  }

  private void learn(int id) {
    RegistryLookup.Found found = lookup.find(id);
    String reason = lookup.reason(id, found, subject, "AVRO");
    if (reason != null) {
      foreign.put(id, reason);
      return;
    }
    try {
      Schema writer = new Schema.Parser().parse(found.schema);
      readers.put(id, new GenericDatumReader<>(writer, reader));
    } catch (RuntimeException e) {
      foreign.put(id, "schema id " + id + " is not an Avro schema: " + describe(e));
    }
  }

  private static String describe(Throwable e) {
    if (e instanceof java.io.EOFException) {
      return "truncated";
    }
    String message = e.getMessage();
    return e.getClass().getSimpleName() + (message == null ? "" : ": " + message.split("\n")[0]);
  }
}
