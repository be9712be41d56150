package lake.formats;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.time.Instant;
import java.time.LocalDate;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.avro.LogicalType;
import org.apache.avro.LogicalTypes;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericFixed;
import org.apache.avro.generic.GenericRecord;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * Avro schemas as Spark types, and Avro values (as Avro's generic reader gives them) as the values
 * Spark takes for those types: a record is a struct of its fields, an enum and a string are strings,
 * bytes and fixed are binary, a union of null and one type is that type (nullable), a union of
 * several types a struct of {@code member0}, {@code member1}, ... (Spark's own mapping), {@code date}
 * a date, {@code timestamp-millis} / {@code -micros} a timestamp, {@code decimal} a decimal.
 */
final class AvroTypes {
  private static final int MAX_DEPTH = 64;

  private AvroTypes() {}

  static DataType sparkType(Schema schema) {
    return sparkType(schema, 0);
  }

  private static DataType sparkType(Schema schema, int depth) {
    if (depth > MAX_DEPTH) {
      throw new IllegalArgumentException("recursive Avro schema (" + schema.getFullName() + ")");
    }
    LogicalType logical = schema.getLogicalType();
    switch (schema.getType()) {
      case RECORD:
        List<StructField> fields = new ArrayList<>();
        for (Schema.Field field : schema.getFields()) {
          fields.add(
              DataTypes.createStructField(
                  field.name(), sparkType(field.schema(), depth + 1), nullable(field.schema())));
        }
        return DataTypes.createStructType(fields);
      case ENUM:
      case STRING:
        return DataTypes.StringType;
      case ARRAY:
        Schema items = schema.getElementType();
        return DataTypes.createArrayType(sparkType(items, depth + 1), nullable(items));
      case MAP:
        Schema values = schema.getValueType();
        return DataTypes.createMapType(
            DataTypes.StringType, sparkType(values, depth + 1), nullable(values));
      case UNION:
        List<Schema> branches = nonNull(schema);
        if (branches.size() == 1) {
          return sparkType(branches.get(0), depth + 1);
        }
        List<StructField> members = new ArrayList<>();
        for (int i = 0; i < branches.size(); i++) {
          members.add(
              DataTypes.createStructField("member" + i, sparkType(branches.get(i), depth + 1), true));
        }
        return DataTypes.createStructType(members);
      case FIXED:
      case BYTES:
        if (logical instanceof LogicalTypes.Decimal) {
          LogicalTypes.Decimal decimal = (LogicalTypes.Decimal) logical;
          return DataTypes.createDecimalType(decimal.getPrecision(), decimal.getScale());
        }
        return DataTypes.BinaryType;
      case INT:
        return logical instanceof LogicalTypes.Date ? DataTypes.DateType : DataTypes.IntegerType;
      case LONG:
        if (logical instanceof LogicalTypes.TimestampMillis
            || logical instanceof LogicalTypes.TimestampMicros) {
          return DataTypes.TimestampType;
        }
        return DataTypes.LongType;
      case FLOAT:
        return DataTypes.FloatType;
      case DOUBLE:
        return DataTypes.DoubleType;
      case BOOLEAN:
        return DataTypes.BooleanType;
      default:
        return DataTypes.NullType;
    }
  }

  static boolean nullable(Schema schema) {
    return schema.getType() == Schema.Type.NULL
        || (schema.getType() == Schema.Type.UNION && schema.isNullable());
  }

  private static List<Schema> nonNull(Schema union) {
    List<Schema> out = new ArrayList<>();
    for (Schema branch : union.getTypes()) {
      if (branch.getType() != Schema.Type.NULL) {
        out.add(branch);
      }
    }
    return out;
  }

  /** {@code value} of {@code schema} as Spark takes a value of {@link #sparkType(Schema)}. */
  static Object toSpark(Object value, Schema schema) {
    if (value == null) {
      return null;
    }
    LogicalType logical = schema.getLogicalType();
    switch (schema.getType()) {
      case RECORD:
        GenericRecord record = (GenericRecord) value;
        List<Schema.Field> fields = schema.getFields();
        Object[] out = new Object[fields.size()];
        for (int i = 0; i < out.length; i++) {
          out[i] = toSpark(record.get(i), fields.get(i).schema());
        }
        return RowFactory.create(out);
      case ENUM:
      case STRING:
        return value.toString();
      case ARRAY:
        List<Object> list = new ArrayList<>();
        for (Object item : (Collection<?>) value) {
          list.add(toSpark(item, schema.getElementType()));
        }
        return list;
      case MAP:
        Map<String, Object> map = new HashMap<>();
        for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
          map.put(entry.getKey().toString(), toSpark(entry.getValue(), schema.getValueType()));
        }
        return map;
      case UNION:
        List<Schema> branches = nonNull(schema);
        int index = GenericData.get().resolveUnion(schema, value);
        Schema branch = schema.getTypes().get(index);
        if (branches.size() == 1) {
          return toSpark(value, branch);
        }
        Object[] members = new Object[branches.size()];
        members[branches.indexOf(branch)] = toSpark(value, branch);
        return RowFactory.create(members);
      case FIXED:
      case BYTES:
        byte[] bytes = bytes(value);
        if (logical instanceof LogicalTypes.Decimal) {
          return new BigDecimal(new BigInteger(bytes), ((LogicalTypes.Decimal) logical).getScale());
        }
        return bytes;
      case INT:
        if (logical instanceof LogicalTypes.Date) {
          return LocalDate.ofEpochDay((Integer) value);
        }
        return value;
      case LONG:
        if (logical instanceof LogicalTypes.TimestampMillis) {
          return Instant.ofEpochMilli((Long) value);
        }
        if (logical instanceof LogicalTypes.TimestampMicros) {
          long micros = (Long) value;
          return Instant.ofEpochSecond(Math.floorDiv(micros, 1_000_000L), Math.floorMod(micros, 1_000_000L) * 1000L);
        }
        return value;
      default:
        return value;
    }
  }

  private static byte[] bytes(Object value) {
    if (value instanceof GenericFixed) {
      return ((GenericFixed) value).bytes();
    }
    ByteBuffer buffer = ((ByteBuffer) value).duplicate();
    byte[] out = new byte[buffer.remaining()];
    buffer.get(out);
    return out;
  }
}
