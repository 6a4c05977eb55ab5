//! What a node checks of the file system its data directory is on.
//!
//! A node keeps each slot as files of its own, so a shard move makes hundreds of files and
//! a rebuild a thousand or more. ext4 made without a journal skips, when it allocates an
//! inode, every inode of the group freed in the last minute (five while the inode's table
//! block is not yet written back), checking them one by one: after many deletes, making
//! one empty file took 200 µs to 1 ms there, against 32-35 µs on a journaled ext4. A node
//! on such a file system says so when it starts (ops/README.md, "Disks").

use std::path::Path;

/// Why making files is slow on the file system holding `dir`, if it is one known to be.
pub fn slow_to_make_files(dir: &Path) -> Option<String> {
    slow_to_make_files_in(Path::new("/sys"), dir)
}

/// [`slow_to_make_files`], reading the kernel's sysfs at `sys`: the device holding `dir`,
/// by its number (`sys/dev/block/MAJOR:MINOR` links to the device, named as ext4 names its
/// file systems), and whether ext4 has a journal task for it (`<none>`: no journal).
#[cfg(target_os = "linux")]
fn slow_to_make_files_in(sys: &Path, dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let number = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let device = std::fs::read_link(sys.join("dev/block").join(number)).ok()?;
    let name = device.file_name()?.to_str()?;
    let journal =
        std::fs::read_to_string(sys.join("fs/ext4").join(name).join("journal_task")).ok()?;
    (journal.trim() == "<none>").then(|| {
        format!(
            "{} is on ext4 without a journal ({name}): there, making a file after many were \
             deleted takes up to a millisecond, and moves and rebuilds make hundreds to \
             thousands of files; ext4 with its journal or XFS makes them some ten times faster \
             (ops/README.md, \"Disks\")",
            dir.display()
        )
    })
}

#[cfg(not(target_os = "linux"))]
fn slow_to_make_files_in(_sys: &Path, _dir: &Path) -> Option<String> {
    None
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A sysfs with the device of `dir` named `name`, and ext4's journal task for it (if
    /// any) reading `journal`.
    fn fake_sys(dir: &Path, name: &str, journal: Option<&str>) -> tempfile::TempDir {
        let sys = tempfile::tempdir().unwrap();
        let dev = std::fs::metadata(dir).unwrap().dev();
        let block = sys.path().join("dev/block");
        std::fs::create_dir_all(&block).unwrap();
        let number = format!("{}:{}", libc::major(dev), libc::minor(dev));
        let target = format!("../../devices/virtual/block/{name}");
        std::os::unix::fs::symlink(target, block.join(number)).unwrap();
        if let Some(journal) = journal {
            let ext4 = sys.path().join("fs/ext4").join(name);
            std::fs::create_dir_all(&ext4).unwrap();
            std::fs::write(ext4.join("journal_task"), journal).unwrap();
        }
        sys
    }

    #[test]
    fn ext4_without_a_journal_is_named_and_others_are_not() {
        let data = tempfile::tempdir().unwrap();
        let none = fake_sys(data.path(), "vdz1", Some("<none>\n"));
        let said = slow_to_make_files_in(none.path(), data.path()).expect("a warning");
        assert!(said.contains("ext4 without a journal (vdz1)"), "{said}");
        assert!(said.contains(&data.path().display().to_string()), "{said}");
        // A journal task, or no ext4 at all (another file system), or no such sysfs.
        let journaled = fake_sys(data.path(), "vdz1", Some("812\n"));
        assert_eq!(slow_to_make_files_in(journaled.path(), data.path()), None);
        let other = fake_sys(data.path(), "vdz1", None);
        assert_eq!(slow_to_make_files_in(other.path(), data.path()), None);
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(slow_to_make_files_in(empty.path(), data.path()), None);
        assert_eq!(
            slow_to_make_files_in(none.path(), &data.path().join("absent")),
            None
        );
    }
}
