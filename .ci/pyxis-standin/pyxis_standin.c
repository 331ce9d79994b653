/*
 * pyxis_standin.c: a SPANK plugin that stands in for NVIDIA's pyxis on bertctl's one-host test
 * cluster (see README.md next to this file). Slurm loads it like pyxis (plugstack.conf), so
 * `srun --container-image=... --container-mounts=...` lines of rendered scripts run unmodified.
 *
 * What it does, per Slurm context:
 *   srun / sbatch (local, allocator): registers pyxis's options and checks their form; a bad
 *       value stops srun/sbatch with "pyxis: --OPTION: what is wrong".
 *   slurmstepd (remote), once per node and step (user_init): checks what only the node can
 *       tell (mount sources and a squashfs image exist, a container name alone names a container
 *       created earlier on this node in this job), keeps named containers in a registry
 *       SPOOL/JOBID/NODE/NAME, and exports PYXIS_STANDIN_* variables describing the container.
 *   each task (task_init_privileged, as root): a private mount namespace with every SRC
 *       bind-mounted on DST; then (task_init) a chdir to the workdir: the task sees container paths.
 *   job epilog: removes the job's registry on the node.
 * There is no image and no enroot: the "container" is the host's filesystem plus the mounts.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/spank.h>

/* The plugin is named "pyxis" so Slurm forwards its options under pyxis's names. */
SPANK_PLUGIN(pyxis, 1);

#define MAX_MOUNTS 64

struct mount_entry {
	char source[PATH_MAX];
	char target[PATH_MAX];
	char flags[256];         /* as given, '+'-separated (pyxis's syntax) */
	unsigned long remount;   /* MS_RDONLY | MS_NOSUID | ... applied after the bind */
};

/* What the options asked for; -1 = flag not given. */
static struct {
	char *image, *name, *name_flags, *mounts_text, *workdir, *save, *env_names, *unshare;
	struct mount_entry mounts[MAX_MOUNTS];
	size_t nmounts;
	int mount_home, remap_root, entrypoint, entrypoint_log, writable;
} args = { .mount_home = -1, .remap_root = -1, .entrypoint = -1, .entrypoint_log = -1, .writable = -1 };

static char spool[PATH_MAX] = "/var/spool/pyxis-standin";  /* plugstack.conf: spool=DIR */
static int node_check_failed;  /* user_init's verdict, reported by every task (see user_init) */

/* ---------------------------------------------------------------- option values */

/* Slurm may hand an option over twice with the same value; a second, different value is an error. */
static int set_once(char **slot, const char *option, const char *value)
{
	if (value == NULL || *value == '\0') {
		slurm_error("pyxis: --%s: argument required", option);
		return -1;
	}
	if (*slot != NULL) {
		if (strcmp(*slot, value) == 0)
			return 0;
		slurm_error("pyxis: --%s: specified multiple times", option);
		return -1;
	}
	*slot = strdup(value);
	return *slot ? 0 : -1;
}

/* A --foo / --no-foo pair: the two must not both be given. */
static int set_flag(int *slot, int value, const char *pair)
{
	if (*slot != -1 && *slot != value) {
		slurm_error("pyxis: --%s: both the option and its opposite were given", pair);
		return -1;
	}
	*slot = value;
	return 0;
}

/* An image is a squashfs path when it starts with '.' or '/' (pyxis's rule), else a docker reference. */
static int image_is_path(const char *image)
{
	return strspn(image, "./") > 0;
}

/* enroot URIs: [docker://|dockerd://][USER@][REGISTRY#]IMAGE[:TAG|@DIGEST] */
static int image_reference_ok(const char *image)
{
	const char *p = image;

	if (strncmp(p, "docker://", 9) == 0)
		p += 9;
	else if (strncmp(p, "dockerd://", 10) == 0)
		p += 10;
	if (*p == '\0' || strstr(p, "://") != NULL)
		return 0;
	return strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/:@#+") == strlen(p);
}

static int opt_image(int val, const char *optarg, int remote)
{
	(void)val; (void)remote;
	if (set_once(&args.image, "container-image", optarg) < 0)
		return -1;
	if (!image_is_path(args.image) && !image_reference_ok(args.image)) {
		slurm_error("pyxis: --container-image: not a docker image reference or a squashfs path: %s", args.image);
		return -1;
	}
	return 0;
}

/* Mount flags, '+'-separated: those that change the emulated mount, and those accepted as-is. */
static int parse_mount_flags(const char *text, unsigned long *remount)
{
	static const char *const accepted[] = { "rw", "bind", "rbind", "private", "rprivate", "slave", "rslave",
		"shared", "rshared", "x-create=dir", "x-create=file", "x-create=auto", NULL };
	char copy[256], *rest = copy, *flag;

	if (strlen(text) >= sizeof(copy))
		return -1;
	strcpy(copy, text);
	while ((flag = strsep(&rest, "+")) != NULL) {
		int known = 0;

		if (strcmp(flag, "ro") == 0) { *remount |= MS_RDONLY; continue; }
		if (strcmp(flag, "nosuid") == 0) { *remount |= MS_NOSUID; continue; }
		if (strcmp(flag, "nodev") == 0) { *remount |= MS_NODEV; continue; }
		if (strcmp(flag, "noexec") == 0) { *remount |= MS_NOEXEC; continue; }
		for (int i = 0; accepted[i]; i++)
			known |= strcmp(flag, accepted[i]) == 0;
		if (!known) {
			slurm_error("pyxis: --container-mounts: unknown mount flag \"%s\" in %s", flag, text);
			return -1;
		}
	}
	return 0;
}

/* One entry: SRC[:DST[:FLAGS]], both paths absolute (stricter than pyxis, which also takes ./relative). */
static int parse_mount(const char *entry)
{
	struct mount_entry *m;
	char copy[3 * PATH_MAX], *rest = copy, *src, *dst, *flags;

	if (args.nmounts == MAX_MOUNTS) {
		slurm_error("pyxis: --container-mounts: more than %d mounts", MAX_MOUNTS);
		return -1;
	}
	if (strlen(entry) >= sizeof(copy)) {
		slurm_error("pyxis: --container-mounts: entry too long: %.64s...", entry);
		return -1;
	}
	strcpy(copy, entry);
	src = strsep(&rest, ":");
	dst = rest ? strsep(&rest, ":") : src;
	flags = rest;
	if (*src == '\0' || *dst == '\0' || (flags && (*flags == '\0' || strchr(flags, ':')))) {
		slurm_error("pyxis: --container-mounts: malformed entry \"%s\" (expected SRC:DST[:FLAGS])", entry);
		return -1;
	}
	if (src[0] != '/' || dst[0] != '/') {
		slurm_error("pyxis: --container-mounts: %s path must be absolute: %s",
			    src[0] != '/' ? "source" : "destination", src[0] != '/' ? src : dst);
		return -1;
	}
	if (strlen(src) >= PATH_MAX || strlen(dst) >= PATH_MAX) {
		slurm_error("pyxis: --container-mounts: path too long in %.64s...", entry);
		return -1;
	}
	m = &args.mounts[args.nmounts];
	memset(m, 0, sizeof(*m));
	if (flags && (strlen(flags) >= sizeof(m->flags) || parse_mount_flags(flags, &m->remount) < 0))
		return -1;
	strcpy(m->source, src);
	strcpy(m->target, dst);
	strcpy(m->flags, flags ? flags : "");
	args.nmounts++;
	return 0;
}

static int opt_mounts(int val, const char *optarg, int remote)
{
	char *copy, *rest, *entry;
	int rc = 0;

	(void)val; (void)remote;
	/* pyxis adds up repeated --container-mounts; the stand-in wants them in one option */
	if (args.mounts_text != NULL && optarg != NULL && strcmp(args.mounts_text, optarg) == 0)
		return 0;  /* the same value handed over again: parsed already */
	if (set_once(&args.mounts_text, "container-mounts", optarg) < 0)
		return -1;
	rest = copy = strdup(optarg);
	while (rc == 0 && (entry = strsep(&rest, ",")) != NULL)
		rc = parse_mount(entry);
	free(copy);
	return rc;
}

static int opt_workdir(int val, const char *optarg, int remote)
{
	(void)val; (void)remote;
	if (set_once(&args.workdir, "container-workdir", optarg) < 0)
		return -1;
	if (args.workdir[0] != '/') {
		slurm_error("pyxis: --container-workdir: must be an absolute path: %s", args.workdir);
		return -1;
	}
	return 0;
}

/* NAME[:FLAGS], FLAGS one of auto (default), create, exec, no_exec. */
static int opt_name(int val, const char *optarg, int remote)
{
	char *colon;

	(void)val; (void)remote;
	if (set_once(&args.name, "container-name", optarg) < 0)
		return -1;
	colon = strchr(args.name, ':');
	args.name_flags = colon ? colon + 1 : "auto";
	if (colon)
		*colon = '\0';
	if (args.name[0] == '\0' || strchr(args.name, '/') != NULL) {
		slurm_error("pyxis: --container-name: not a container name: %s", optarg);
		return -1;
	}
	if (strcmp(args.name_flags, "auto") && strcmp(args.name_flags, "create") &&
	    strcmp(args.name_flags, "exec") && strcmp(args.name_flags, "no_exec")) {
		slurm_error("pyxis: --container-name: flag must be auto, create, exec or no_exec: %s", optarg);
		return -1;
	}
	return 0;
}

static int opt_save(int val, const char *optarg, int remote)
{
	(void)val; (void)remote;
	if (set_once(&args.save, "container-save", optarg) < 0)
		return -1;
	if (args.save[strlen(args.save) - 1] == '/') {
		slurm_error("pyxis: --container-save: target is a directory: %s", args.save);
		return -1;
	}
	return 0;
}

/* Comma-separated lists of names (--container-env) or namespaces (--container-unshare). */
static int opt_env(int val, const char *optarg, int remote)
{
	(void)val; (void)remote;
	if (set_once(&args.env_names, "container-env", optarg) < 0)
		return -1;
	if (strstr(args.env_names, ",,") || args.env_names[0] == ',' ||
	    args.env_names[strlen(args.env_names) - 1] == ',') {
		slurm_error("pyxis: --container-env: empty name in %s", args.env_names);
		return -1;
	}
	return 0;
}

static int opt_unshare(int val, const char *optarg, int remote)
{
	char *copy, *rest, *ns;
	int rc = 0;

	(void)val; (void)remote;
	if (set_once(&args.unshare, "container-unshare", optarg) < 0)
		return -1;
	rest = copy = strdup(args.unshare);
	while (rc == 0 && (ns = strsep(&rest, ",")) != NULL)
		if (strcmp(ns, "net") && strcmp(ns, "ipc") && strcmp(ns, "uts")) {
			slurm_error("pyxis: --container-unshare: unknown namespace \"%s\" (net, ipc or uts)", ns);
			rc = -1;
		}
	free(copy);
	return rc;
}

static int opt_mount_home(int val, const char *o, int r) { (void)o; (void)r; return set_flag(&args.mount_home, val, "container-mount-home"); }
static int opt_remap_root(int val, const char *o, int r) { (void)o; (void)r; return set_flag(&args.remap_root, val, "container-remap-root"); }
static int opt_entrypoint(int val, const char *o, int r) { (void)o; (void)r; return set_flag(&args.entrypoint, val, "container-entrypoint"); }
static int opt_entrypoint_log(int val, const char *o, int r) { (void)o; (void)r; args.entrypoint_log = val; return 0; }
static int opt_writable(int val, const char *o, int r) { (void)o; (void)r; return set_flag(&args.writable, val, "container-writable"); }

/* pyxis 0.24's options, with its argument names; usage texts say what the stand-in does with them. */
static struct spank_option options[] = {
	{ "container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
	  "[pyxis stand-in] image: a docker reference (recorded) or an existing squashfs file", 1, 0, opt_image },
	{ "container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]",
	  "[pyxis stand-in] bind mounts, emulated in a private mount namespace; flags '+'-separated", 1, 0, opt_mounts },
	{ "container-workdir", "PATH", "[pyxis stand-in] working directory of the task", 1, 0, opt_workdir },
	{ "container-name", "NAME[:FLAGS]",
	  "[pyxis stand-in] named container, reusable by later steps of the job on the same node", 1, 0, opt_name },
	{ "container-save", "PATH", "[pyxis stand-in] recorded only", 1, 0, opt_save },
	{ "container-mount-home", NULL, "[pyxis stand-in] recorded only", 0, 1, opt_mount_home },
	{ "no-container-mount-home", NULL, "[pyxis stand-in] recorded only", 0, 0, opt_mount_home },
	{ "container-remap-root", NULL, "[pyxis stand-in] recorded only", 0, 1, opt_remap_root },
	{ "no-container-remap-root", NULL, "[pyxis stand-in] recorded only", 0, 0, opt_remap_root },
	{ "container-entrypoint", NULL, "[pyxis stand-in] recorded only", 0, 1, opt_entrypoint },
	{ "no-container-entrypoint", NULL, "[pyxis stand-in] recorded only", 0, 0, opt_entrypoint },
	{ "container-entrypoint-log", NULL, "[pyxis stand-in] recorded only", 0, 1, opt_entrypoint_log },
	{ "container-writable", NULL, "[pyxis stand-in] recorded only", 0, 1, opt_writable },
	{ "container-readonly", NULL, "[pyxis stand-in] recorded only", 0, 0, opt_writable },
	{ "container-env", "NAME[,NAME...]", "[pyxis stand-in] recorded only", 1, 0, opt_env },
	{ "container-unshare", "NS[,NS...]", "[pyxis stand-in] recorded only (net, ipc, uts)", 1, 1, opt_unshare },
	SPANK_OPTIONS_TABLE_END
};

/* ---------------------------------------------------------------- plugin entry points */

/* plugstack.conf's arguments; every entry point gets them (the epilog runs without init). */
static void read_plugin_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++)
		if (strncmp(av[i], "spool=", 6) == 0 && strlen(av[i] + 6) < sizeof(spool))
			strcpy(spool, av[i] + 6);
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	read_plugin_args(ac, av);
	if (spank_context() == S_CTX_SLURMD || spank_context() == S_CTX_JOB_SCRIPT)
		return 0;  /* slurmd and the epilog take no options */
	/* registered here rather than as the spank_options symbol so sbatch/salloc see them too */
	for (int i = 0; options[i].name != NULL; i++)
		if (spank_option_register(sp, &options[i]) != ESPANK_SUCCESS) {
			slurm_error("pyxis: could not register --%s", options[i].name);
			return -1;
		}
	return 0;
}

static int container_enabled(void)
{
	return args.image != NULL || args.name != NULL;
}

static int mkdir_p(const char *path, mode_t mode)
{
	char buf[PATH_MAX];

	if (strlen(path) >= sizeof(buf))
		return -1;
	strcpy(buf, path);
	for (char *p = buf + 1; *p; p++)
		if (*p == '/') {
			*p = '\0';
			if (mkdir(buf, mode) < 0 && errno != EEXIST)
				return -1;
			*p = '/';
		}
	return (mkdir(buf, mode) < 0 && errno != EEXIST) ? -1 : 0;
}

/* SPOOL/JOBID/NODE: slurmstepd and the epilog get the node's name from slurmd in SLURMD_NODENAME. */
static int registry_dir(spank_t sp, char *dir, size_t size)
{
	uint32_t jobid;
	const char *node = getenv("SLURMD_NODENAME");

	if (spank_get_item(sp, S_JOB_ID, &jobid) != ESPANK_SUCCESS || node == NULL)
		return -1;
	return snprintf(dir, size, "%s/%u/%s", spool, jobid, node) < (int)size ? 0 : -1;
}

/* The registry is made as root here (user_init runs with the job user's privileges). */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	char dir[PATH_MAX];
	uid_t uid;
	gid_t gid;

	(void)ac; (void)av;
	if (spank_context() != S_CTX_REMOTE || !container_enabled() || args.name == NULL)
		return 0;
	if (registry_dir(sp, dir, sizeof(dir)) < 0 || mkdir_p(dir, 0755) < 0) {
		slurm_error("pyxis: could not create the container registry %s: %s", dir, strerror(errno));
		return -1;
	}
	if (spank_get_item(sp, S_JOB_UID, &uid) == ESPANK_SUCCESS &&
	    spank_get_item(sp, S_JOB_GID, &gid) == ESPANK_SUCCESS && chown(dir, uid, gid) < 0)
		slurm_error("pyxis: could not chown %s: %s", dir, strerror(errno));
	return 0;
}

static int check_image_on_node(const char *image, const char *node)
{
	struct stat st;

	if (!image_is_path(image))
		return 0;  /* a docker reference: nothing to pull here */
	if (stat(image, &st) < 0 || !S_ISREG(st.st_mode)) {
		slurm_error("pyxis: --container-image: squashfs file does not exist on %s: %s", node, image);
		return -1;
	}
	return 0;
}

static int check_mount_sources(const char *node)
{
	struct stat st;

	for (size_t i = 0; i < args.nmounts; i++)
		if (stat(args.mounts[i].source, &st) < 0) {
			slurm_error("pyxis: --container-mounts: source path does not exist on %s: %s",
				    node, args.mounts[i].source);
			return -1;
		}
	return 0;
}

/*
 * A named container: reuse it when this node has it in this job, create it from --container-image
 * otherwise. *image gets the container's image, *how "created" or "reused".
 */
static int resolve_named_container(spank_t sp, const char *node, char *image, size_t size, const char **how)
{
	char dir[PATH_MAX], path[PATH_MAX + 256];
	FILE *f;
	int exists;

	if (registry_dir(sp, dir, sizeof(dir)) < 0)
		return -1;
	snprintf(path, sizeof(path), "%s/%s", dir, args.name);
	exists = access(path, F_OK) == 0;
	if (exists && strcmp(args.name_flags, "create") == 0) {
		slurm_error("pyxis: --container-name: \"%s\" already exists on %s (flag create)", args.name, node);
		return -1;
	}
	if (exists) {
		f = fopen(path, "r");
		if (f == NULL || fgets(image, (int)size, f) == NULL) {
			slurm_error("pyxis: --container-name: registry entry unreadable: %s", path);
			if (f)
				fclose(f);
			return -1;
		}
		fclose(f);
		image[strcspn(image, "\n")] = '\0';
		*how = "reused";
		return 0;
	}
	if (args.image == NULL || strcmp(args.name_flags, "exec") == 0) {
		slurm_error("pyxis: --container-name: no container \"%s\" on %s in this job, and no --container-image to create it",
			    args.name, node);
		return -1;
	}
	if (check_image_on_node(args.image, node) < 0)
		return -1;
	f = fopen(path, "w");
	if (f == NULL || fprintf(f, "%s\n", args.image) < 0 || fclose(f) != 0) {
		slurm_error("pyxis: --container-name: could not record %s: %s", path, strerror(errno));
		return -1;
	}
	snprintf(image, size, "%s", args.image);
	*how = "created";
	return 0;
}

static void export_flag(spank_t sp, const char *var, int value)
{
	if (value != -1)
		spank_setenv(sp, var, value ? "1" : "0", 1);
}

/* What the container got, for every task of the step (and the probe) to read. */
static void export_record(spank_t sp, const char *image, const char *how)
{
	spank_setenv(sp, "PYXIS_STANDIN", how, 1);
	spank_setenv(sp, "PYXIS_STANDIN_IMAGE", image, 1);
	if (args.name)
		spank_setenv(sp, "PYXIS_STANDIN_NAME", args.name, 1);
	if (args.mounts_text)
		spank_setenv(sp, "PYXIS_STANDIN_MOUNTS", args.mounts_text, 1);
	if (args.workdir)
		spank_setenv(sp, "PYXIS_STANDIN_WORKDIR", args.workdir, 1);
	if (args.save)
		spank_setenv(sp, "PYXIS_STANDIN_SAVE", args.save, 1);
	if (args.env_names)
		spank_setenv(sp, "PYXIS_STANDIN_ENV", args.env_names, 1);
	if (args.unshare)
		spank_setenv(sp, "PYXIS_STANDIN_UNSHARE", args.unshare, 1);
	export_flag(sp, "PYXIS_STANDIN_MOUNT_HOME", args.mount_home);
	export_flag(sp, "PYXIS_STANDIN_REMAP_ROOT", args.remap_root);
	export_flag(sp, "PYXIS_STANDIN_ENTRYPOINT", args.entrypoint);
	export_flag(sp, "PYXIS_STANDIN_WRITABLE", args.writable);
}

/*
 * Once per node and step. Like pyxis, a failure here is only remembered: Slurm does not pass
 * user_init's error back to srun, a failing task does (slurm_spank_task_init_privileged).
 */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	char image[PATH_MAX] = "";
	const char *how = "temporary";
	const char *node = getenv("SLURMD_NODENAME");

	(void)ac; (void)av;
	if (!container_enabled())
		return 0;
	if (node == NULL)
		node = "this node";
	if (args.name != NULL)
		node_check_failed = resolve_named_container(sp, node, image, sizeof(image), &how) < 0;
	else {
		node_check_failed = check_image_on_node(args.image, node) < 0;
		snprintf(image, sizeof(image), "%s", args.image);
	}
	if (!node_check_failed)
		node_check_failed = check_mount_sources(node) < 0;
	if (!node_check_failed)
		export_record(sp, image, how);
	return 0;
}

/* DST gets a directory for a directory SRC, an empty file otherwise (a bind needs a matching target). */
static int make_target(const struct mount_entry *m)
{
	struct stat st;
	char parent[PATH_MAX];
	FILE *f;

	if (stat(m->source, &st) < 0)
		return -1;
	if (S_ISDIR(st.st_mode))
		return mkdir_p(m->target, 0755);
	strcpy(parent, m->target);
	*strrchr(parent, '/') = '\0';
	if (parent[0] && mkdir_p(parent, 0755) < 0)
		return -1;
	if (access(m->target, F_OK) == 0)
		return 0;
	f = fopen(m->target, "a");
	return f ? fclose(f) : -1;
}

/* Each task: its own mount namespace (private, so nothing leaks to the host) and the binds. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	(void)sp; (void)ac; (void)av;
	if (!container_enabled())
		return 0;
	if (node_check_failed)
		return -1;
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
		slurm_error("pyxis: could not make a private mount namespace: %s", strerror(errno));
		return -1;
	}
	for (size_t i = 0; i < args.nmounts; i++) {
		const struct mount_entry *m = &args.mounts[i];

		if (make_target(m) < 0 || mount(m->source, m->target, NULL, MS_BIND | MS_REC, NULL) < 0 ||
		    (m->remount && mount(NULL, m->target, NULL, MS_REMOUNT | MS_BIND | m->remount, NULL) < 0)) {
			slurm_error("pyxis: --container-mounts: could not mount %s on %s: %s",
				    m->source, m->target, strerror(errno));
			return -1;
		}
	}
	if (args.workdir && mkdir_p(args.workdir, 0755) < 0) {
		slurm_error("pyxis: --container-workdir: could not create %s: %s", args.workdir, strerror(errno));
		return -1;
	}
	return 0;
}

/* The workdir is entered here, as the job user: slurmstepd returns to the job's cwd after the privileged hook. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)sp; (void)ac; (void)av;
	if (container_enabled() && args.workdir && chdir(args.workdir) < 0) {
		slurm_error("pyxis: --container-workdir: could not enter %s: %s", args.workdir, strerror(errno));
		return -1;
	}
	return 0;
}

/* Named containers live as long as the job (pyxis's default container_scope=job). */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	char dir[PATH_MAX], path[PATH_MAX + 256];
	struct dirent *entry;
	DIR *d;

	read_plugin_args(ac, av);
	if (registry_dir(sp, dir, sizeof(dir)) < 0 || (d = opendir(dir)) == NULL)
		return 0;
	while ((entry = readdir(d)) != NULL)
		if (entry->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/%s", dir, entry->d_name);
			unlink(path);
		}
	closedir(d);
	rmdir(dir);
	*strrchr(dir, '/') = '\0';
	rmdir(dir);  /* the job's folder goes with its last node */
	return 0;
}
