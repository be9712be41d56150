package lake.formats;

import org.apache.spark.sql.api.java.UDF1;

/** Why a record is not a Schema Registry framed record (null: it is one, or it is null). */
public final class FrameProblem implements UDF1<byte[], String> {
  private static final long serialVersionUID = 1L;

  @Override
  public String call(byte[] raw) {
    return raw == null ? null : Framing.problem(raw);
  }
}
