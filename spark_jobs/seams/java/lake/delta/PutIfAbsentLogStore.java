package lake.delta;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

/**
 * Delta's log on an object store that creates an object only if it is absent (S3's PUT with
 * {@code If-None-Match: *}; S3A's conditional create): each commit file {@code _delta_log/N.json}
 * is created by exactly one writer, whichever drivers and machines commit version N at once.
 *
 * <p>Delta's own {@code S3SingleDriverLogStore} checks that N is absent and then writes it: two
 * drivers that check at the same moment both write, and the second commit replaces the first (a
 * lost commit). Here the store itself refuses the second PUT (412), which is reported to Delta as
 * {@link FileAlreadyExistsException}: Delta then reads the winner's commit, checks it for conflicts
 * with its own and retries at N+1 or refuses (its optimistic concurrency, as on HDFS).
 *
 * <p>A PUT whose answer was lost is retried by S3A; the retry then meets the object its own first
 * attempt created. Each write therefore carries a random id in the object's metadata, and a refused
 * write whose object carries its own id is the write that succeeded.
 *
 * <p>Writes with {@code overwrite} ({@code _last_checkpoint}) replace the object as before. Listing
 * is the file system's: S3 lists what it has written, strongly consistent since 2020.
 *
 * <p>Fences: a process that holds a lease on a lake root (the product's leases, renewed from Python)
 * keeps a fence here per lease, a deadline on this JVM's monotonic clock renewed with the lease. Once
 * a deadline has passed (the lease was not renewed in time: the holder may have lost it to another
 * machine) every commit of this JVM under that root is refused, before its PUT.
 */
public class PutIfAbsentLogStore extends HadoopFileSystemLogStore {

  /** (root + NUL + lease name) -> the System.nanoTime() from which commits under the root stop. */
  private static final Map<String, Long> FENCES = new ConcurrentHashMap<>();

  /** S3A's create option: the check for an existing object made by the store, at the PUT. */
  static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";
  /** The object's metadata entry with the writer's id, as S3A sets and reads it back. */
  static final String WRITE_ID = "lake-commit-id";
  static final String WRITE_ID_OPTION = "fs.s3a.create.header." + WRITE_ID;
  static final String WRITE_ID_ATTRIBUTE = "header." + WRITE_ID;

  public PutIfAbsentLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    refuseWhenFenced(path);
    FileSystem fs = path.getFileSystem(hadoopConf);
    byte[] body = join(actions);
    if (overwrite) {
      try (FSDataOutputStream out = fs.create(path, true)) {
        out.write(body);
      }
      return;
    }
    String id = UUID.randomUUID().toString();
    FSDataOutputStreamBuilder<?, ?> create = fs.createFile(path).overwrite(false);
    create.must(CONDITIONAL_CREATE, true);
    create.must(WRITE_ID_OPTION, id);
    try (FSDataOutputStream out = create.build()) {
      out.write(body);
    } catch (RemoteFileChangedException | org.apache.hadoop.fs.FileAlreadyExistsException refused) {
      if (!writtenBy(fs, path, id)) {
        FileAlreadyExistsException exists = new FileAlreadyExistsException(path.toString());
        exists.initCause(refused);
        throw exists;
      }
    }
  }

  /**
   * Commits under {@code root} (a lake root, {@code s3a://bucket/prefix}) stop {@code millis} from
   * now, unless this is called again for {@code lease} before then.
   */
  public static void fence(String root, String lease, long millis) {
    FENCES.put(root + '\0' + lease, System.nanoTime() + millis * 1_000_000L);
  }

  /** The lease was released: its fence goes. */
  public static void lift(String root, String lease) {
    FENCES.remove(root + '\0' + lease);
  }

  private static void refuseWhenFenced(Path path) throws IOException {
    String where = path.toUri().toString();
    long now = System.nanoTime();
    for (Map.Entry<String, Long> fence : FENCES.entrySet()) {
      String[] rootAndLease = fence.getKey().split("\0", 2);
      if (where.startsWith(rootAndLease[0] + "/") && now - fence.getValue() >= 0) {
        throw new IOException(
            "lake-lease-lapsed: commit to "
                + where
                + " refused: this process's lease "
                + rootAndLease[1]
                + " on "
                + rootAndLease[0]
                + " was not renewed in time, and another machine may hold it now");
      }
    }
  }

  /** Whether the object at {@code path} is the one the write with {@code id} created. */
  private static boolean writtenBy(FileSystem fs, Path path, String id) throws IOException {
    try {
      byte[] found = fs.getXAttr(path, WRITE_ID_ATTRIBUTE);
      return found != null && id.equals(new String(found, StandardCharsets.UTF_8).trim());
    } catch (FileNotFoundException | UnsupportedOperationException gone) {
      return false;
    }
  }

  private static byte[] join(Iterator<String> actions) {
    StringBuilder text = new StringBuilder();
    while (actions.hasNext()) {
      text.append(actions.next()).append('\n');
    }
    return text.toString().getBytes(StandardCharsets.UTF_8);
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false; // a PUT is whole or absent
  }
}
