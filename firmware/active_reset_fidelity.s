; active_reset_fidelity.s - how well active reset leaves a qubit in |0>, shot after shot.
;
; Run with:  qlink sim --model firmware/active_reset_fidelity.json firmware/active_reset_fidelity.s
;                      --json active_reset_fidelity.json
; (the HOST_CALL handler is reset_decision of firmware/active_reset.py, which the .py beside
; this file serves; the model file gives the qubit a T1 of 20 us and a noisy readout, so that
; the reset's errors show in SHOTS shots; without --model the default qubit resets almost
; perfectly)
;
; Each shot is firmware/active_reset.s followed by a check:
;   t=0      pi/2 pulse: an equal superposition of |0> and |1>
;   t=64     readout window -> r1; CALL reset_decision(r1:1) -> r2 (the real-time host's answer)
;   now+64   if r2 is 1: the conditional pi pulse, |1> -> |0>
;   then     a second readout -> r3: the check (the model's projection says whether the reset
;            left the qubit in |0>); a pi pulse when r3 is 1 (a local reset, no CALL) prepares
;            the next shot
; The reset fails when the first readout is misassigned (the conditional pulse flips the wrong
; state), or when the qubit decays from |1> during the feedback latency (the readout, the CALL's
; round trip and the SYNC slack) before the conditional pulse turns it over.
;
; The JSON's measurements, per shot: the first readout, then the check. Its rpc list has one
; reset_decision per shot with the bit the PPU sent (args) and the host's answer (result).

.equ DRIVE, 0
.equ READOUT, 0
.equ PULSE, 64                  ; samples of the gaussian (cycles at one sample per cycle)
.equ WINDOW, 25                 ; readout window, cycles
.equ SLACK, 64                  ; SYNC slack after the CALL, cycles
.equ SHOTS, 48

.envelope gauss, gaussian, length=PULSE, sigma=16, amp=1.0   ; amp 1.0 = pi

        set r4, SHOTS
shot:   play DRIVE, gauss, amp=0.5              ; pi/2
        wait PULSE
        acquire READOUT, r1, window=WINDOW, threshold=0
        wait WINDOW
        call reset_decision(r1:1) -> r2         ; stalls until r1 is valid
        sync SLACK
        beq r2, 0, check
        play DRIVE, gauss, amp=1.0              ; the conditional pi pulse
        wait PULSE
check:  acquire READOUT, r3, window=WINDOW, threshold=0
        wait WINDOW
        beq r3, 0, zero                         ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0              ; local reset for the next shot
        wait PULSE
        jmp next
zero:   sync 32
next:   add r4, r4, -1
        bne r4, 0, shot
        end
