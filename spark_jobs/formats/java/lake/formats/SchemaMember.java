package lake.formats;

import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.sql.api.java.UDF1;

/**
 * Why a record is not a framed record of one of a subject's versions (null: it is one, or it is
 * null), for a format whose records decode without their writer schema (JSON Schema): the frame, then
 * the schema id, asked of the registry when the driver did not know it.
 */
public final class SchemaMember implements UDF1<byte[], String> {
  private static final long serialVersionUID = 1L;

  private final String subject;
  private final String type;
  private final String knownJson;
  private final String foreignJson;
  private final RegistryLookup lookup;
  private transient Set<Integer> known;
  private transient Map<Integer, String> foreign;

  public SchemaMember(
      String subject,
      String type,
      String knownJson,
      String foreignJson, String registry) {
    this.subject = subject;
    this.type = type;
    this.knownJson = knownJson;
    this.foreignJson = foreignJson;
    this.lookup = new RegistryLookup(registry);
  }

  private void open() throws Exception {
    ObjectMapper mapper = new ObjectMapper();
    known = new HashSet<>();
    for (JsonNode id : mapper.readTree(knownJson)) {
      known.add(id.asInt());
    }
    foreign = new HashMap<>();
    JsonNode reasons = mapper.readTree(foreignJson);
    for (Iterator<String> ids = reasons.fieldNames(); ids.hasNext(); ) {
      String id = ids.next();
      foreign.put(Integer.parseInt(id), reasons.get(id).asText());
    }
  }

  @Override
  public String call(byte[] raw) throws Exception {
    if (raw == null) {
      return null;
    }
    if (known == null) {
      open();
    }
    String problem = Framing.problem(raw);
    if (problem != null) {
      return problem;
    }
    int id = Framing.schemaId(raw);
    if (known.contains(id)) {
      return null;
    }
    if (!foreign.containsKey(id) && lookup.canAsk()) {
      String reason = lookup.reason(id, lookup.find(id), subject, type);
      if (reason == null) {
        known.add(id);
        return null;
      }
      foreign.put(id, reason);
    }
    String reason = foreign.get(id);
    return reason != null ? reason : "unknown schema id " + id + " (not a version of " + subject + ")";
  }
}
