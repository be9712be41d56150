package lake.formats;

import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;

/**
 * One of the product's functions as a Spark Java UDF. Called from Python, {@code functions.udf(f,
 * type)} has two overloads that take a {@code UDF1} (the Java UDF and the untyped Scala one, which
 * Spark refuses); Py4J picks between them in whatever order the JVM lists the methods. Here the
 * compiler picks the Java one, always.
 */
public final class JavaUdf {
  private JavaUdf() {}

  public static UserDefinedFunction of(UDF1<?, ?> function, DataType returnType) {
    return functions.udf(function, returnType);
  }
}
