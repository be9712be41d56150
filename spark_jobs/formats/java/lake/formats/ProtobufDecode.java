package lake.formats;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.InvalidProtocolBufferException;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;

/**
 * Decodes Schema Registry framed Protobuf records on the executors: {@code struct<value, error>},
 * the topic's message read with the reader schema (a subject's version, compiled by the driver into
 * a {@code FileDescriptorSet}), or why it cannot be: no magic byte, truncated, message indexes that
 * name no message of the writer schema or another message than the topic's, a schema id outside the
 * subject, bytes that are not such a message. The message indexes are resolved in the writer schema
 * the frame names (a writer version that added or moved messages puts the topic's elsewhere).
 */
public final class ProtobufDecode implements UDF1<byte[], Row> {
  private static final long serialVersionUID = 1L;

  private final String subject;
  private final String descriptors;
  private final String message;
  private final String knownJson;
  private final String foreignJson;
  private final RegistryLookup lookup;
  private transient FileDescriptor file;
  private transient Descriptor topicMessage;
  private transient Map<Integer, Map<String, String>> known; // id -> message indexes -> full name
  private transient Map<Integer, String> foreign;

  /**
   * @param subject the subject whose versions the records are written with (for the reasons)
   * @param descriptors base64 of the reader schema's FileDescriptorSet (its imports first)
   * @param message the full name of the topic's message in it
   * @param knownJson {"id": {"0": "pkg.Message", "1.0": "pkg.Other.Nested", ...}, ...}: the
   *     subject's versions, each with its messages by their message indexes (protoc's)
   * @param foreignJson {"id": "reason", ...}: ids outside the subject, and why they do not decode
   * @param registry the settings to ask the registry about an id none of these name with, as JSON
   *     (lake.formats.RegistryLookup; empty: none to ask)
   */
  public ProtobufDecode(
      String subject,
      String descriptors,
      String message,
      String knownJson,
      String foreignJson, String registry) {
    this.subject = subject;
    this.descriptors = descriptors;
    this.message = message;
    this.knownJson = knownJson;
    this.foreignJson = foreignJson;
    this.lookup = new RegistryLookup(registry);
  }

  /** The UDF's return type: {@code struct<value: the message's type, error: string>}. */
  public static DataType returnType(String descriptors, String message) throws Exception {
    Descriptor found = find(file(descriptors), message);
    return DataTypes.createStructType(
        new StructField[] {
          DataTypes.createStructField("value", ProtobufTypes.sparkType(found), true),
          DataTypes.createStructField("error", DataTypes.StringType, true)
        });
  }

  static FileDescriptor file(String descriptors) throws Exception {
    FileDescriptorSet set = FileDescriptorSet.parseFrom(Base64.getDecoder().decode(descriptors));
    Map<String, FileDescriptor> built = new HashMap<>();
    FileDescriptor last = null;
    for (FileDescriptorProto proto : set.getFileList()) {
      List<FileDescriptor> deps = new ArrayList<>();
      for (String dependency : proto.getDependencyList()) {
        deps.add(built.get(dependency));
      }
      last = FileDescriptor.buildFrom(proto, deps.toArray(new FileDescriptor[0]));
      built.put(proto.getName(), last);
    }
    return last;
  }

  /** The message of {@code fullName} in {@code file}, nested ones too. */
  static Descriptor find(FileDescriptor file, String fullName) {
    String pkg = file.getPackage();
    String[] names = (pkg.isEmpty() ? fullName : fullName.substring(pkg.length() + 1)).split("\\.");
    Descriptor found = file.findMessageTypeByName(names[0]);
    for (int i = 1; i < names.length && found != null; i++) {
      found = found.findNestedTypeByName(names[i]);
    }
    if (found == null) {
      throw new IllegalArgumentException("no message " + fullName + " in " + file.getName());
    }
    return found;
  }

  private void open() throws Exception {
    file = file(descriptors);
    topicMessage = find(file, message);
    ObjectMapper mapper = new ObjectMapper();
    known = new HashMap<>();
    JsonNode versions = mapper.readTree(knownJson);
    for (Iterator<String> ids = versions.fieldNames(); ids.hasNext(); ) {
      String id = ids.next();
      Map<String, String> names = new HashMap<>();
      versions.get(id).fields().forEachRemaining(e -> names.put(e.getKey(), e.getValue().asText()));
      known.put(Integer.parseInt(id), names);
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
    if (file == null) {
      open();
    }
    String problem = Framing.problem(raw);
    if (problem != null) {
      return RowFactory.create(null, problem);
    }
    int id = Framing.schemaId(raw);
    if (!known.containsKey(id) && !foreign.containsKey(id) && lookup.canAsk()) {
      // a version registered since the job was planned (its messages outlined here), or not
      RegistryLookup.Found found = lookup.find(id);
      String reason = lookup.reason(id, found, subject, "PROTOBUF");
      if (reason == null) {
        known.put(id, ProtobufOutline.of(found.schema));
      } else {
        foreign.put(id, reason);
      }
    }
    if (!known.containsKey(id)) {
      String reason = foreign.get(id);
      return RowFactory.create(
          null, reason != null ? reason : "unknown schema id " + id + " (not a version of " + subject + ")");
    }
    Framing.Indexes indexes;
    try {
      indexes = Framing.messageIndexes(raw);
    } catch (IllegalArgumentException e) {
      return RowFactory.create(null, e.getMessage());
    }
    // the indexes name a message of the writer schema; the topic's is read with the reader's
    String written = known.get(id).get(key(indexes.path));
    if (written == null) {
      return RowFactory.create(
          null,
          "message indexes " + Arrays.toString(indexes.path) + " name no message of schema id " + id
              + " (" + subject + ")");
    }
    if (!written.equals(message)) {
      return RowFactory.create(
          null,
          "message indexes " + Arrays.toString(indexes.path) + " name " + written + ", not the topic's "
              + message);
    }
    try {
      DynamicMessage decoded =
          DynamicMessage.parseFrom(topicMessage, Arrays.copyOfRange(raw, indexes.start, raw.length));
      return RowFactory.create(ProtobufTypes.toSpark(decoded), null);
    } catch (InvalidProtocolBufferException e) {
      return RowFactory.create(
          null, "not a Protobuf " + message + " of schema id " + id + ": " + e.getMessage());
    }
  }

  private static String key(int[] path) {
    StringBuilder out = new StringBuilder();
    for (int index : path) {
      out.append(out.length() == 0 ? "" : ".").append(index);
    }
    return out.toString();
  }
}
