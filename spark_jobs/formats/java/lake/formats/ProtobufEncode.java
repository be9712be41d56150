package lake.formats;

import java.io.ByteArrayOutputStream;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.sql.Timestamp;
import java.time.Instant;
import java.util.List;
import java.util.Map;

import com.google.protobuf.ByteString;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.DynamicMessage;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF1;
import scala.collection.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Writes a published changelog's rows as Schema Registry framed Protobuf records on the executors:
 * the row's fields in order are the message's fields 1, 2, ... (the schema the driver derived from
 * the result's columns), framed with the schema id and the message indexes [0]. A null field is
 * left unset (its presence says so); a null element of a list is left out.
 */
public final class ProtobufEncode implements UDF1<Row, byte[]> {
  private static final long serialVersionUID = 1L;

  private final String descriptors;
  private final String message;
  private final int schemaId;
  private transient Descriptor descriptor;

  public ProtobufEncode(String descriptors, String message, int schemaId) {
    this.descriptors = descriptors;
    this.message = message;
    this.schemaId = schemaId;
  }

  @Override
  public byte[] call(Row row) throws Exception {
    if (row == null) {
      return null;
    }
    if (descriptor == null) {
      descriptor = ProtobufDecode.find(ProtobufDecode.file(descriptors), message);
    }
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.write(0);
    out.write(ByteBuffer.allocate(4).putInt(schemaId).array());
    out.write(0); // message indexes [0]: the schema's first message
    message(row, descriptor).writeTo(out);
    return out.toByteArray();
  }

  private static DynamicMessage message(Row row, Descriptor type) {
    DynamicMessage.Builder builder = DynamicMessage.newBuilder(type);
    List<FieldDescriptor> fields = type.getFields();
    for (int i = 0; i < fields.size() && i < row.length(); i++) {
      Object value = row.get(i);
      if (value == null) {
        continue;
      }
      FieldDescriptor field = fields.get(i);
      if (field.isMapField()) {
        FieldDescriptor k = field.getMessageType().findFieldByName("key");
        FieldDescriptor v = field.getMessageType().findFieldByName("value");
        for (Map.Entry<?, ?> entry : asMap(value).entrySet()) {
          if (entry.getValue() == null) {
            continue;
          }
          DynamicMessage pair =
              DynamicMessage.newBuilder(field.getMessageType())
                  .setField(k, single(k, entry.getKey()))
                  .setField(v, single(v, entry.getValue()))
                  .build();
          builder.addRepeatedField(field, pair);
        }
      } else if (field.isRepeated()) {
        for (Object item : asList(value)) {
          if (item != null) {
            builder.addRepeatedField(field, single(field, item));
          }
        }
      } else {
        builder.setField(field, single(field, value));
      }
    }
    return builder.build();
  }

  private static Object single(FieldDescriptor field, Object value) {
    switch (field.getJavaType()) {
      case STRING:
        return value instanceof BigDecimal ? ((BigDecimal) value).toPlainString() : value.toString();
      case BYTE_STRING:
        return ByteString.copyFrom((byte[]) value);
      case INT:
        return ((Number) value).intValue();
      case LONG:
        return ((Number) value).longValue();
      case FLOAT:
        return ((Number) value).floatValue();
      case DOUBLE:
        return ((Number) value).doubleValue();
      case MESSAGE:
        Descriptor type = field.getMessageType();
        if ("google.protobuf.Timestamp".equals(type.getFullName())) {
          Instant at = value instanceof Timestamp ? ((Timestamp) value).toInstant() : (Instant) value;
          return DynamicMessage.newBuilder(type)
              .setField(type.findFieldByName("seconds"), at.getEpochSecond())
              .setField(type.findFieldByName("nanos"), at.getNano())
              .build();
        }
        return message((Row) value, type);
      default:
        return value;
    }
  }

  private static List<?> asList(Object value) {
    return value instanceof List ? (List<?>) value : CollectionConverters.asJava((Seq<?>) value);
  }

  private static Map<?, ?> asMap(Object value) {
    return value instanceof Map
        ? (Map<?, ?>) value
        : CollectionConverters.asJava((scala.collection.Map<?, ?>) value);
  }
}
