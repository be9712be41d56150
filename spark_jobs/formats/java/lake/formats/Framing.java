package lake.formats;

import java.nio.ByteBuffer;

/**
 * The Schema Registry's wire format: magic byte 0, the schema id as a 4-byte big-endian integer,
 * for Protobuf the message indexes (a zigzag varint count, then that many zigzag varints; a single
 * 0 byte stands for [0], the file's first message), then the encoded record.
 */
final class Framing {
  private Framing() {}

  /** Why {@code raw} is not a framed record, or null when it is one (5 bytes at least, magic 0). */
  static String problem(byte[] raw) {
    if (raw.length == 0) {
      return "empty record (a framed record has magic byte 0 and a 4-byte schema id first)";
    }
    if (raw[0] != 0) {
      return String.format(
          "no magic byte: the record starts with 0x%02X%s, not 0x00 followed by a schema id",
          raw[0] & 0xff, guess(raw[0]));
    }
    if (raw.length < 5) {
      return "truncated: " + raw.length + " bytes, a framed record has at least 5";
    }
    return null;
  }

  private static String guess(byte first) {
    if (first == '{' || first == '[') {
      return " (plain JSON, written without the registry)";
    }
    if (first == '"') {
      return " (a JSON string, written without the registry)";
    }
    return "";
  }

  static int schemaId(byte[] raw) {
    return ByteBuffer.wrap(raw, 1, 4).getInt();
  }

  /** Protobuf's message indexes after the schema id, and where the message itself starts. */
  static final class Indexes {
    final int[] path;
    final int start;

    Indexes(int[] path, int start) {
      this.path = path;
      this.start = start;
    }
  }

  static Indexes messageIndexes(byte[] raw) {
    int[] position = {5};
    int count = zigzag(raw, position);
    if (count == 0) {
      return new Indexes(new int[] {0}, position[0]);
    }
    if (count < 0 || count > 100) {
      throw new IllegalArgumentException("message indexes: a count of " + count + " is not one");
    }
    int[] path = new int[count];
    for (int i = 0; i < count; i++) {
      path[i] = zigzag(raw, position);
    }
    return new Indexes(path, position[0]);
  }

  private static int zigzag(byte[] raw, int[] position) {
    int shift = 0;
    long result = 0;
    while (true) {
      if (position[0] >= raw.length) {
        throw new IllegalArgumentException("truncated inside the message indexes");
      }
      byte b = raw[position[0]++];
      result |= (long) (b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        break;
      }
      shift += 7;
      if (shift > 35) {
        throw new IllegalArgumentException("message indexes: a varint longer than 5 bytes");
      }
    }
    return (int) ((result >>> 1) ^ -(result & 1));
  }
}
