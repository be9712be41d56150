package lake.formats;

import java.io.IOException;
import java.io.Serializable;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * A schema id the driver did not know when it planned the job, asked of the registry from the
 * executor that meets it (Confluent's API: {@code /schemas/ids/{id}} and {@code
 * /schemas/ids/{id}/versions}), once per id and JVM: a version of the topic's subject registered
 * while the job runs is decoded with it, any other id gets its reason. A registry that does not
 * answer fails the task (and so the micro-batch, which is not committed and runs again): a record
 * is never skipped or turned into nulls because the registry was away.
 */
final class RegistryLookup implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final ConcurrentHashMap<String, Found> CACHE = new ConcurrentHashMap<>();
  private static final Duration TIMEOUT = Duration.ofSeconds(15);

  /** What the registry says of an id: its schema and type, and the subjects it is a version of. */
  static final class Found {
    final String schema; // null: the registry has no such id
    final String type; // AVRO, PROTOBUF, JSON
    final List<String> subjects;

    Found(String schema, String type, List<String> subjects) {
      this.schema = schema;
      this.type = type;
      this.subjects = subjects;
    }
  }

  private final String url; // null: no registry to ask (the pipeline test driver's in-process one)
  private final String authorization; // the Authorization header, or null

  RegistryLookup(String url, String authorization) {
    this.url = url == null || url.isEmpty() ? null : url.replaceAll("/+$", "");
    this.authorization = authorization == null || authorization.isEmpty() ? null : authorization;
  }

  boolean canAsk() {
    return url != null;
  }

  String url() {
    return url;
  }

  Found find(int id) {
    return CACHE.computeIfAbsent(url + "#" + id, key -> ask(id));
  }

  private Found ask(int id) {
    try {
      JsonNode schema = get("/schemas/ids/" + id);
      if (schema == null) {
        return new Found(null, null, List.of());
      }
      List<String> subjects = new ArrayList<>();
      JsonNode versions = get("/schemas/ids/" + id + "/versions");
      if (versions != null) {
        for (JsonNode version : versions) {
          subjects.add(version.path("subject").asText());
        }
      }
      String type = schema.hasNonNull("schemaType") ? schema.get("schemaType").asText() : "AVRO";
      return new Found(schema.path("schema").asText(), type, subjects);
    } catch (IOException e) {
      throw new IllegalStateException(
          "the Schema Registry at " + url + " did not answer for schema id " + id + ": " + e, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while asking the Schema Registry at " + url, e);
    }
  }

  /** The JSON the registry answers at {@code path}, null for a 404. */
  private JsonNode get(String path) throws IOException, InterruptedException {
    HttpRequest.Builder request =
        HttpRequest.newBuilder(URI.create(url + path))
            .timeout(TIMEOUT)
            .header("Accept", "application/vnd.schemaregistry.v1+json, application/json");
    if (authorization != null) {
      request.header("Authorization", authorization);
    }
    HttpResponse<String> response =
        HttpClient.newBuilder()
            .connectTimeout(TIMEOUT)
            .build()
            .send(request.GET().build(), HttpResponse.BodyHandlers.ofString());
    if (response.statusCode() == 404) {
      return null;
    }
    if (response.statusCode() != 200) {
      throw new IOException("HTTP " + response.statusCode() + ": " + response.body());
    }
    return new ObjectMapper().readTree(response.body());
  }

  /**
   * Why {@code found} cannot be decoded as a version of {@code subject} in format {@code type}
   * (null: it can).
   */
  String reason(int id, Found found, String subject, String type) {
    if (found.schema == null) {
      return "unknown schema id " + id + " (the Schema Registry at " + url + " has no such schema)";
    }
    if (!type.equals(found.type)) {
      return "schema id " + id + " is a " + format(found.type) + " schema, not " + format(type);
    }
    if (!found.subjects.contains(subject)) {
      String owners = found.subjects.isEmpty() ? "no subject" : String.join(", ", found.subjects);
      return "schema id " + id + " belongs to " + owners + ", not to " + subject;
    }
    return null;
  }

  /** The product's name of a registry schema type. */
  static String format(String type) {
    return "JSON".equals(type) ? "json_schema" : type.toLowerCase();
  }
}
