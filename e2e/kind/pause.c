// pause: the sandbox process of every pod. Sleeps until told to stop and
// reaps the zombies of the pod's shared PID namespace.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig)
{
	(void)sig;
	_exit(0);
}

static void reap(int sig)
{
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void)
{
	struct sigaction term = { .sa_handler = stop };
	struct sigaction chld = { .sa_handler = reap, .sa_flags = SA_NOCLDSTOP };

	if (getpid() != 1)
		fprintf(stderr, "pause: warning: not PID 1\n");
	if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
	    sigaction(SIGCHLD, &chld, NULL) < 0)
		return 1;
	for (;;)
		pause();
}
