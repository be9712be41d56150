package lake.formats;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.Serializable;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;

import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLException;
import javax.net.ssl.TrustManagerFactory;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * A schema id the driver did not know when it planned the job, asked of the registry from the
 * executor that meets it (Confluent's API: {@code /schemas/ids/{id}} and {@code
 * /schemas/ids/{id}/versions}), once per id and JVM, with the driver's settings: the URL, the
 * Authorization header (basic or bearer credentials), the TLS trust (the CA's certificates) and the
 * client certificate and key, each as text (the executors share no files with the driver), the
 * request timeout and the retries.
 *
 * <p>A version of the topic's subject registered while the job runs is decoded with it, any other
 * id gets its reason. A registry that does not answer (refused connection, timeout, HTTP 5xx, after
 * the retries) fails the task as an outage ({@code did not answer}: the micro-batch is not
 * committed and runs again). A registry that answers with a refusal (HTTP 401, 403, a 404 that is
 * not the registry's "no such schema", another 4xx, a TLS handshake that fails) fails it as {@link
 * Refused}: waiting does not mend that, and the job stops. A record is never skipped or turned into
 * nulls because the registry was away.
 */
final class RegistryLookup implements Serializable {
  private static final long serialVersionUID = 2L;
  private static final ConcurrentHashMap<String, Found> CACHE = new ConcurrentHashMap<>();
  private static final ConcurrentHashMap<String, HttpClient> CLIENTS = new ConcurrentHashMap<>();

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

  /** A registry that refuses the executors' request: the job stops rather than wait. */
  static final class Refused extends IllegalStateException {
    private static final long serialVersionUID = 1L;

    Refused(String message, Throwable cause) {
      super(message, cause);
    }
  }

  private final String settings; // the JSON the driver gave (empty: no registry to ask)
  private final String url; // null: no registry to ask (the pipeline test driver's in-process one)
  private final String authorization; // the Authorization header, or null
  private final Duration timeout;
  private final int retries;

  /**
   * @param settings JSON: {@code url}, {@code authorization}, {@code ca} (PEM certificates to
   *     trust), {@code certificate} and {@code key} (the client's, PEM; the key PKCS#8), {@code
   *     timeout} (seconds), {@code retries}; empty: no registry to ask
   */
  RegistryLookup(String settings) {
    this.settings = settings == null ? "" : settings;
    JsonNode conf = parse(this.settings);
    String found = conf.path("url").asText("");
    this.url = found.isEmpty() ? null : found.replaceAll("/+$", "");
    String auth = conf.path("authorization").asText("");
    this.authorization = auth.isEmpty() ? null : auth;
    this.timeout = Duration.ofMillis((long) (conf.path("timeout").asDouble(15.0) * 1000));
    this.retries = conf.path("retries").asInt(2);
  }

  private static JsonNode parse(String settings) {
    try {
      return new ObjectMapper().readTree(settings.isEmpty() ? "{}" : settings);
    } catch (IOException e) {
      throw new IllegalArgumentException("the registry settings are not JSON: " + e.getMessage(), e);
    }
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
    IOException last = null;
    for (int attempt = 0; attempt <= retries; attempt++) {
      if (attempt > 0) {
        pause(500L * attempt);
      }
      try {
        JsonNode schema = get("/schemas/ids/" + id, id);
        if (schema == null) {
          return new Found(null, null, List.of());
        }
        List<String> subjects = new ArrayList<>();
        JsonNode versions = get("/schemas/ids/" + id + "/versions", id);
        if (versions != null) {
          for (JsonNode version : versions) {
            subjects.add(version.path("subject").asText());
          }
        }
        String type = schema.hasNonNull("schemaType") ? schema.get("schemaType").asText() : "AVRO";
        return new Found(schema.path("schema").asText(), type, subjects);
      } catch (SSLException e) {
        throw new Refused(
            "the Schema Registry at " + url + " refused the executors' request for schema id " + id
                + ": TLS: " + e.getMessage(),
            e);
      } catch (IOException e) {
        last = e;
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException("interrupted while asking the Schema Registry at " + url, e);
      }
    }
    throw new IllegalStateException(
        "the Schema Registry at " + url + " did not answer for schema id " + id + " ("
            + (retries + 1) + " attempts): " + last,
        last);
  }

  private static void pause(long millis) {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * The JSON the registry answers at {@code path}, null for its "no such schema" (a 404 with one of
   * its 404xx error codes). An outage is an {@link IOException}; a refusal is {@link Refused}.
   */
  private JsonNode get(String path, int id) throws IOException, InterruptedException {
    HttpRequest.Builder request =
        HttpRequest.newBuilder(URI.create(url + path))
            .timeout(timeout)
            .header("Accept", "application/vnd.schemaregistry.v1+json, application/json");
    if (authorization != null) {
      request.header("Authorization", authorization);
    }
    HttpResponse<String> response =
        client().send(request.GET().build(), HttpResponse.BodyHandlers.ofString());
    int status = response.statusCode();
    if (status == 200) {
      return new ObjectMapper().readTree(response.body());
    }
    if (status >= 500 || status == 408 || status == 429) {
      throw new IOException("HTTP " + status + ": " + firstLine(response.body()));
    }
    if (status == 404 && errorCode(response.body()) / 100 == 404) {
      return null; // the registry's own "not found": no such schema id
    }
    String why =
        status == 401 || status == 403
            ? "the credentials were refused"
            : status == 404 ? "not a Schema Registry's API at this URL" : firstLine(response.body());
    throw new Refused(
        "the Schema Registry at " + url + " refused the executors' request for schema id " + id
            + ": HTTP " + status + " (" + why + ")",
        null);
  }

  private static int errorCode(String body) {
    try {
      return new ObjectMapper().readTree(body).path("error_code").asInt(0);
    } catch (IOException e) {
      return 0;
    }
  }

  private static String firstLine(String body) {
    String text = body == null ? "" : body.strip();
    int end = text.indexOf('\n');
    text = end < 0 ? text : text.substring(0, end);
    return text.length() > 200 ? text.substring(0, 200) + "..." : text;
  }

  /** One HTTP client per settings and JVM, with the TLS the settings give. */
  private HttpClient client() {
    return CLIENTS.computeIfAbsent(settings, key -> build());
  }

  private HttpClient build() {
    HttpClient.Builder builder = HttpClient.newBuilder().connectTimeout(timeout);
    JsonNode conf = parse(settings);
    String ca = conf.path("ca").asText("");
    String certificate = conf.path("certificate").asText("");
    String key = conf.path("key").asText("");
    if (!ca.isEmpty() || !certificate.isEmpty()) {
      try {
        SSLContext context = SSLContext.getInstance("TLS");
        context.init(
            certificate.isEmpty() ? null : keyManagers(certificate, key),
            ca.isEmpty() ? null : trustManagers(ca),
            null);
        builder.sslContext(context);
      } catch (Exception e) {
        throw new Refused(
            "the Schema Registry settings' TLS files cannot be used on the executors: " + e.getMessage(),
            e);
      }
    }
    return builder.build();
  }

  private static Collection<? extends Certificate> certificates(String pem) throws Exception {
    return CertificateFactory.getInstance("X.509")
        .generateCertificates(new ByteArrayInputStream(pem.getBytes(StandardCharsets.US_ASCII)));
  }

  private static javax.net.ssl.TrustManager[] trustManagers(String pem) throws Exception {
    KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
    store.load(null, null);
    int n = 0;
    for (Certificate certificate : certificates(pem)) {
      store.setCertificateEntry("ca" + n++, certificate);
    }
    TrustManagerFactory factory =
        TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
    factory.init(store);
    return factory.getTrustManagers();
  }

  private static javax.net.ssl.KeyManager[] keyManagers(String certificatePem, String keyPem)
      throws Exception {
    String body =
        keyPem
            .replaceAll("-----BEGIN PRIVATE KEY-----", "")
            .replaceAll("-----END PRIVATE KEY-----", "")
            .replaceAll("\\s", "");
    PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(Base64.getDecoder().decode(body));
    PrivateKey key = null;
    for (String algorithm : new String[] {"RSA", "EC", "Ed25519"}) {
      try {
        key = KeyFactory.getInstance(algorithm).generatePrivate(spec);
        break;
      } catch (Exception e) {
        // another algorithm
      }
    }
    if (key == null) {
      throw new IllegalArgumentException("the client key is not an RSA, EC or Ed25519 PKCS#8 key");
    }
    char[] none = new char[0];
    KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
    store.load(null, null);
    store.setKeyEntry("client", key, none, certificates(certificatePem).toArray(new Certificate[0]));
    KeyManagerFactory factory = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
    factory.init(store, none);
    return factory.getKeyManagers();
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
