package lake.joins;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.execution.streaming.runtime.MemoryStream;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

/**
 * A streaming source fed from the driver: the pipeline test driver's stand-in for Kafka. Each
 * {@link #add} is one offset, so the next micro-batch reads it whole.
 */
public final class MemorySource {
  private final MemoryStream<Row> stream;

  public MemorySource(SparkSession spark, StructType schema) {
    stream = MemoryStream.apply(Encoders.row(schema), spark);
  }

  public Dataset<Row> frame() {
    return stream.toDF();
  }

  public void add(Dataset<Row> rows) {
    stream.addData(CollectionConverters.asScala(rows.collectAsList()));
  }
}
