package lake.formats;

import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import com.google.protobuf.ByteString;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Message;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;

/**
 * Protobuf messages as Spark values: a message is a struct of its fields (in declaration order, by
 * their .proto names), a repeated field a list, a map field a map, an enum its value's name, bytes
 * binary, unsigned 32-bit integers long, {@code google.protobuf.Timestamp} a timestamp. A message
 * field that is not set, and a scalar with presence ({@code optional}) that is not set, are null;
 * a proto3 scalar without presence is its default, as Protobuf reads it.
 */
final class ProtobufTypes {
  private static final int MAX_DEPTH = 32;
  private static final String TIMESTAMP = "google.protobuf.Timestamp";

  private ProtobufTypes() {}

  static DataType sparkType(Descriptor message) {
    return struct(message, 0);
  }

  private static DataType struct(Descriptor message, int depth) {
    if (depth > MAX_DEPTH) {
      throw new IllegalArgumentException("recursive Protobuf message (" + message.getFullName() + ")");
    }
    List<StructField> fields = new ArrayList<>();
    for (FieldDescriptor field : message.getFields()) {
      fields.add(DataTypes.createStructField(field.getName(), fieldType(field, depth), true));
    }
    return DataTypes.createStructType(fields);
  }

  private static DataType fieldType(FieldDescriptor field, int depth) {
    if (field.isMapField()) {
      Descriptor entry = field.getMessageType();
      return DataTypes.createMapType(
          single(entry.findFieldByName("key"), depth + 1),
          single(entry.findFieldByName("value"), depth + 1),
          true);
    }
    DataType one = single(field, depth);
    return field.isRepeated() ? DataTypes.createArrayType(one, true) : one;
  }

  private static DataType single(FieldDescriptor field, int depth) {
    switch (field.getJavaType()) {
      case INT:
        return isUnsigned(field) ? DataTypes.LongType : DataTypes.IntegerType;
      case LONG:
        return DataTypes.LongType;
      case FLOAT:
        return DataTypes.FloatType;
      case DOUBLE:
        return DataTypes.DoubleType;
      case BOOLEAN:
        return DataTypes.BooleanType;
      case STRING:
      case ENUM:
        return DataTypes.StringType;
      case BYTE_STRING:
        return DataTypes.BinaryType;
      default:
        if (TIMESTAMP.equals(field.getMessageType().getFullName())) {
          return DataTypes.TimestampType;
        }
        return struct(field.getMessageType(), depth + 1);
    }
  }

  private static boolean isUnsigned(FieldDescriptor field) {
    return field.getType() == FieldDescriptor.Type.UINT32
        || field.getType() == FieldDescriptor.Type.FIXED32;
  }

  static Object toSpark(Message message) {
    List<FieldDescriptor> fields = message.getDescriptorForType().getFields();
    Object[] out = new Object[fields.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = field(message, fields.get(i));
    }
    return RowFactory.create(out);
  }

  private static Object field(Message message, FieldDescriptor field) {
    if (field.isMapField()) {
      Map<Object, Object> map = new HashMap<>();
      FieldDescriptor key = field.getMessageType().findFieldByName("key");
      FieldDescriptor value = field.getMessageType().findFieldByName("value");
      for (Object entry : (List<?>) message.getField(field)) {
        Message pair = (Message) entry;
        map.put(single(key, pair.getField(key)), single(value, pair.getField(value)));
      }
      return map;
    }
    if (field.isRepeated()) {
      List<Object> list = new ArrayList<>();
      for (Object item : (List<?>) message.getField(field)) {
        list.add(single(field, item));
      }
      return list;
    }
    if (field.hasPresence() && !message.hasField(field)) {
      return null;
    }
    return single(field, message.getField(field));
  }

  private static Object single(FieldDescriptor field, Object value) {
    switch (field.getJavaType()) {
      case INT:
        return isUnsigned(field) ? Integer.toUnsignedLong((Integer) value) : value;
      case ENUM:
        return ((EnumValueDescriptor) value).getName();
      case BYTE_STRING:
        return ((ByteString) value).toByteArray();
      case MESSAGE:
        Message inner = (Message) value;
        if (TIMESTAMP.equals(field.getMessageType().getFullName())) {
          FieldDescriptor seconds = inner.getDescriptorForType().findFieldByName("seconds");
          FieldDescriptor nanos = inner.getDescriptorForType().findFieldByName("nanos");
          return Instant.ofEpochSecond((Long) inner.getField(seconds), (Integer) inner.getField(nanos));
        }
        return toSpark(inner);
      default:
        return value;
    }
  }
}
