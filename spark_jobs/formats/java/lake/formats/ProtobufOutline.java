package lake.formats;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The messages of a {@code .proto} schema by their message indexes, read from its text on the
 * executor that meets a writer version the driver did not know (protoc, which the driver compiles
 * the known versions with, is not there): top-level and nested messages in declaration order, proto2
 * groups and the entry messages protoc makes for {@code map<K, V>} fields among them, as protoc's
 * descriptors number them and a Confluent serializer writes them. Only the structure is read: field
 * types, options and enums are skipped.
 */
public final class ProtobufOutline {
  private static final List<String> LABELS = List.of("optional", "required", "repeated");

  private ProtobufOutline() {}

  /** Message indexes ("0", "1.0", ...) to the message's full name. */
  public static Map<String, String> of(String proto) {
    List<String> tokens = tokens(proto);
    Map<String, String> names = new HashMap<>();
    String pkg = "";
    Deque<Frame> stack = new ArrayDeque<>();
    Frame top = new Frame("", "", true);
    stack.push(top);
    for (int i = 0; i < tokens.size(); i++) {
      String token = tokens.get(i);
      Frame here = stack.peek();
      if (token.equals("package") && stack.size() == 1 && i + 1 < tokens.size()) {
        pkg = tokens.get(i + 1);
        top.name = pkg;
      } else if (here.message && token.equals("message") && i + 2 < tokens.size()
          && tokens.get(i + 2).equals("{")) {
        stack.push(here.child(tokens.get(i + 1), names));
        i += 2;
      } else if (here.message && token.equals("group") && i > 0 && LABELS.contains(tokens.get(i - 1))
          && i + 2 < tokens.size() && tokens.get(i + 2).equals("=")) {
        // proto2: LABEL group Name = N [options] { ... } is a nested message Name
        int open = tokens.subList(i, tokens.size()).indexOf("{");
        if (open > 0) {
          stack.push(here.child(tokens.get(i + 1), names));
          i += open;
        }
      } else if (here.message && token.equals("map") && i + 1 < tokens.size()
          && tokens.get(i + 1).equals("<")) {
        // map<K, V> name = N: protoc adds the nested message NameEntry here
        int close = tokens.subList(i, tokens.size()).indexOf(">");
        if (close > 0 && i + close + 1 < tokens.size()) {
          here.child(camel(tokens.get(i + close + 1)) + "Entry", names);
          i += close + 1;
        }
      } else if (token.equals("{")) {
        stack.push(new Frame("", "", false)); // an enum, a service, a oneof, an option's value
      } else if (token.equals("}")) {
        if (stack.size() > 1) {
          stack.pop();
        }
      }
    }
    return names;
  }

  private static final class Frame {
    String name; // full name (the package for the file)
    final String path; // its indexes, "" for the file
    final boolean message; // may hold messages
    int children;

    Frame(String name, String path, boolean message) {
      this.name = name;
      this.path = path;
      this.message = message;
    }

    Frame child(String simple, Map<String, String> names) {
      String full = name.isEmpty() ? simple : name + "." + simple;
      String at = path.isEmpty() ? Integer.toString(children) : path + "." + children;
      children++;
      names.put(at, full);
      return new Frame(full, at, true);
    }
  }

  /** protoc's name of a map field's entry message: the field's name in CamelCase. */
  static String camel(String field) {
    StringBuilder out = new StringBuilder();
    boolean upper = true;
    for (char c : field.toCharArray()) {
      if (c == '_') {
        upper = true;
      } else {
        out.append(upper ? Character.toUpperCase(c) : c);
        upper = false;
      }
    }
    return out.toString();
  }

  /** Identifiers (dotted), numbers and single symbols; comments and string literals dropped. */
  static List<String> tokens(String text) {
    List<String> out = new ArrayList<>();
    int i = 0;
    int n = text.length();
    while (i < n) {
      char c = text.charAt(i);
      if (Character.isWhitespace(c)) {
        i++;
      } else if (c == '/' && i + 1 < n && text.charAt(i + 1) == '/') {
        while (i < n && text.charAt(i) != '\n') {
          i++;
        }
      } else if (c == '/' && i + 1 < n && text.charAt(i + 1) == '*') {
        int end = text.indexOf("*/", i + 2);
        i = end < 0 ? n : end + 2;
      } else if (c == '"' || c == '\'') {
        i++;
        while (i < n && text.charAt(i) != c) {
          i += text.charAt(i) == '\\' ? 2 : 1;
        }
        i++;
      } else if (Character.isLetterOrDigit(c) || c == '_' || c == '.') {
        int start = i;
        while (i < n && (Character.isLetterOrDigit(text.charAt(i)) || text.charAt(i) == '_'
            || text.charAt(i) == '.')) {
          i++;
        }
        out.add(text.substring(start, i));
      } else {
        out.add(String.valueOf(c));
        i++;
      }
    }
    return out;
  }
}
